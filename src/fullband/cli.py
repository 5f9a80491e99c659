"""``fullband <command>``: thin entry points over the library. Each command's options come from a config
dataclass (help from its field docs), set by ``--config FILE`` (TOML/YAML) and ``--key value`` overrides."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fullband import rundir
from fullband.bench.config import BenchConfig
from fullband.config import CheckConfig, ConfigError
from fullband.configio import add_dataclass_arguments, config_from_args, given_values, short_help
from fullband.data.config import PrepareConfig
from fullband.evaluation.config import LmEvalConfig
from fullband.experiments.core.registry import StudyCommand, study_commands
from fullband.experiments.core.study import run_study
from fullband.generation.config import GenerateConfig
from fullband.serve.config import ServeConfig
from fullband.training.config import TrainRunConfig
from fullband.training.resume import train_config
from fullband.version import __version__


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(piece) for piece in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(
            f"--prompt {text!r}: this checkpoint has no tokenizer, so the prompt must be token ids "
            "separated by spaces or commas"
        ) from None


def run_generate(cfg: GenerateConfig) -> None:
    import torch

    from fullband.context import fit_context
    from fullband.families import load_any, load_tokenizer_of
    from fullband.generation.decoding import decode

    model = load_any(cfg.checkpoint, device=cfg.device)  # a model argument of any family, as its spec loads it
    tokenizer = load_tokenizer_of(cfg.checkpoint)
    prompt = tokenizer.encode(cfg.prompt) if tokenizer is not None else _parse_ids(cfg.prompt)
    if not prompt:
        raise ConfigError("--prompt is empty: give some text (or token ids) to continue")
    vocab, context = model.config.vocab_size, model.config.max_seq_len
    if bad := [t for t in prompt if not 0 <= t < vocab]:
        raise ConfigError(f"--prompt token id {bad[0]} is out of range: this model's ids are 0..{vocab - 1}")
    # The server's context rule and wording (fullband.context): a text's start is dropped to fit, ids are exact.
    fit = fit_context(len(prompt), cfg.max_new_tokens, context, text=tokenizer is not None, minimum=0,
                      name="max_new_tokens")
    if fit.dropped:
        print(f"fullband generate: warning: the prompt's first {fit.dropped} of {len(prompt)} tokens were dropped "
              f"so that it and --max_new_tokens {cfg.max_new_tokens} fit the model's context of {context}",
              file=sys.stderr)
    elif fit.new_tokens < cfg.max_new_tokens:
        print(f"fullband generate: note: {fit.new_tokens} tokens fit after the {len(prompt)}-token prompt in the "
              f"model's context of {context}; generating those", file=sys.stderr)
    prompt = prompt[fit.dropped :]
    eos = [tokenizer.eos_id] if tokenizer is not None and cfg.stop_at_eos and tokenizer.eos_id is not None else []
    stops = [*eos, *cfg.decode.stop_token_ids]
    options = dataclasses.replace(cfg.decode, stop_token_ids=tuple(stops))
    if options.step == "compiled":  # else the first token seems to hang
        print("fullband generate: note: the decode step compiles before its first token (seconds to a minute; "
              "faster when torch's compile cache holds it)", file=sys.stderr)
    steps = decode(model, prompt, fit.new_tokens, options, speculative=_speculative(cfg, model))
    generated: list[int] = []
    shown = ""
    with torch.no_grad():
        if tokenizer is None:
            print(" ".join(map(str, prompt)), end="", flush=True)
        else:
            print(tokenizer.decode(prompt) if fit.dropped else cfg.prompt, end="", flush=True)
        for step in steps:
            token = int(step[0])
            if token in stops:
                break
            generated.append(token)
            if tokenizer is None:
                print(f" {token}", end="", flush=True)
            else:
                # Decode the whole continuation each step: a byte tokenizer can split a UTF-8 character.
                text = tokenizer.decode(generated)
                print(text[len(shown) :], end="", flush=True)
                shown = text
    print()


def _speculative(cfg: GenerateConfig, model):
    """The SpeculativeConfig of ``--drafter`` (a drafter name, or a checkpoint directory to load), or None."""
    if not cfg.drafter:
        return None
    from fullband.families import load_any
    from fullband.generation.drafters import is_drafter_name
    from fullband.generation.speculative import SpeculativeConfig

    drafter = cfg.drafter if is_drafter_name(cfg.drafter) else load_any(cfg.drafter, device=cfg.device)
    if not isinstance(drafter, str):
        drafter = drafter.to(dtype=model.embed.weight.dtype)
    return SpeculativeConfig(drafter=drafter, gamma=cfg.gamma, adaptive=cfg.adaptive_gamma,
                             max_gamma=max(16, cfg.gamma))


def run_train(cfg: TrainRunConfig) -> None:
    from fullband.training.run import run_train as train

    result = train(cfg, announce=True)
    print(f"\ntrained {result.steps} steps, {result.tokens:,} tokens ({result.token_equiv_compute:,} "
          f"token-equivalent compute) in {result.seconds:.0f} s")
    if result.final_mfu is not None:  # nanoGPT's figure: model FLOPs against the GPU's rated peak
        print(f"MFU {100 * result.final_mfu:.1f}% over the last logged steps")
    if result.final_pass_losses is not None:  # next-token losses, as val_loss_kpass measures them
        losses = result.final_pass_losses
        last = f", pass {len(losses)} {losses[-1]:.4f}" if len(losses) > 1 else ""
        print(f"last step's next-token loss: pass 1 {losses[0]:.4f}{last}; objective {result.final_loss:.4f}")
    for name, value in sorted(result.validation.items()):
        print(f"  {name:<20} {value:.4f}")
    print(f"model: {result.model_dir}   (fullband generate --checkpoint {result.model_dir} --prompt ...)")


def run_prepare(cfg: PrepareConfig) -> None:
    from fullband.data.prepare import prepare_shards

    index = prepare_shards(cfg)
    train, val = index["splits"]["train"], index["splits"]["validation"]
    if index["already_done"]:
        print(f"{cfg.out_dir} is already prepared with these options")
    else:
        rate = index["input_bytes"] / 1e6 / max(index["seconds"], 1e-9)
        speed = f" ({rate:.1f} MB/s)" if index["input_bytes"] else ""
        print(f"prepared in {index['seconds']:.1f} s{speed}")
    print(f"train: {train['tokens']:,} tokens in {len(train['shards'])} shard(s); validation: {val['tokens']:,} "
          f"tokens; {index['dtype']}, vocabulary {index['vocab_size']:,}")
    print(f"train on it: fullband train --data.source {cfg.out_dir} --out_dir runs/mine")


def run_check(cfg: CheckConfig) -> None:
    from fullband.selfcheck import run_check as check

    if not check(cfg.seq_len, cfg.plain_prefix, cfg.seed, cfg.device):
        raise SystemExit(1)


def run_eval_lm(cfg: LmEvalConfig) -> None:
    from fullband.evaluation.run import run_lm_eval

    _, table = run_lm_eval(cfg)
    print(table)
    print(f"results: {Path(cfg.out_dir) / rundir.RESULTS}")


def run_study_command(command: StudyCommand, cfg: Any) -> None:
    """Any study of the registry: build it from its config, run it, print its summary."""
    print(run_study(command.build_study(cfg)))


def run_bench(cfg: BenchConfig) -> None:
    from fullband.bench.run import run_bench as bench
    from fullband.bench.run import table

    print(table(bench(cfg, progress=lambda message: print(message, file=sys.stderr, flush=True))))
    if cfg.json:
        print(f"results: {cfg.json}")


def run_serve(cfg: ServeConfig) -> None:
    from fullband.serve.server import run_serve as serve

    serve(cfg)


@dataclass(frozen=True)
class Command:
    """One ``fullband`` subcommand: its options (a config class) and what runs them."""

    name: str
    config: type
    run: Callable[[Any], None]
    help: str


CORE_COMMANDS = (
    Command("train", TrainRunConfig, run_train,
            "Train a full-bandwidth transformer (or the feedback=False baseline)."),
    Command("prepare", PrepareConfig, run_prepare,
            "Tokenize text, JSONL or a dataset into memory-mapped token shards."),
    Command("generate", GenerateConfig, run_generate,
            "Decode from a checkpoint in standard, soft, fused or exact mode."),
    Command("serve", ServeConfig, run_serve, "OpenAI-compatible HTTP server (every mode, continuous batching)."),
    Command("check", CheckConfig, run_check, "Verify that sequential, multi-pass, chunked and cached decoding agree."),
    Command("eval", LmEvalConfig, run_eval_lm, "Run lm-evaluation-harness tasks on a checkpoint in a decoding mode."),
    Command("bench", BenchConfig, run_bench, "Speed beside transformers' Llama and GPT-2, with the machine's limits."),
)


def commands() -> dict[str, Command]:
    """Every subcommand: the library's own, then each study's from the study registry
    (:mod:`fullband.experiments.core.registry`), which this module reads and never names."""
    table = {c.name: c for c in CORE_COMMANDS}
    for study in study_commands():
        table[study.name] = Command(study.name, study.config_class(), functools.partial(run_study_command, study),
                                    study.help)
    return table


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what is wrong and where the options are listed (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (options: {self.prog} --help)\n")


def build_parser(table: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    table = commands() if table is None else table
    parser = _Parser(
        prog="fullband",
        description="The full-bandwidth transformer: train, compare, decode, evaluate and serve.",
    )
    parser.add_argument("--version", action="version", version=f"fullband {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in table.values():
        cmd = sub.add_parser(command.name, help=command.help, description=command.help, allow_abbrev=False)
        cmd.add_argument("--config", default=None, metavar="FILE", help="TOML or YAML file with these options.")
        add_dataclass_arguments(cmd, command.config)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """parse_args, but an unknown option is answered by the command's parser with the closest known option."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        command = commands.get(args.command, parser)
        known = [s for action in command._actions for s in action.option_strings]
        unknown = next((e for e in extra if e.startswith("-")), extra[0]).split("=", 1)[0]
        spelled: dict[str, str] = {}  # normalised -> as --help shows it (the underscore spelling)
        for option in sorted((k for k in known if k.startswith("--")), key=lambda k: "_" in k):
            spelled["--" + option[2:].replace("-", "_")] = option
        close = difflib.get_close_matches("--" + unknown.lstrip("-").replace("-", "_"), list(spelled), n=1)
        hint = f"; did you mean {spelled[close[0]]}?" if close else ""
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _help_view(parser: argparse.ArgumentParser, table: dict[str, Command], argv: list[str]) -> str | None:
    """``fullband CMD --help`` of a command with a short view (its config's COMMON_OPTIONS): those options and a line
    naming ``--help-all``; None for any other command line."""
    if not argv or argv[0] not in table or not {"-h", "--help"} & set(argv):
        return None
    common = getattr(table[argv[0]].config, "COMMON_OPTIONS", None)
    if common is None:
        return None
    command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[0]]
    every = sum(1 for a in command._actions if a.help != argparse.SUPPRESS and a.option_strings) - 1  # less -h
    return short_help(command, common, f"fullband {argv[0]} --help-all lists all {every} options, by section.")


@contextlib.contextmanager
def _one_line_warnings(command: str) -> Iterator[None]:
    """While a command runs, a warning is one line on stderr, ``fullband CMD: warning: ...``, not Python's
    ``file:line: Category: ...`` and source line. Only the format changes: library code keeps warnings.warn, and
    filters and recorders (``warnings.catch_warnings(record=True)``, ``pytest.warns``) see the warnings as before."""

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
        return f"fullband {command}: warning: {' '.join(str(message).split()) or category.__name__}\n"

    formatted, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        yield
    finally:
        warnings.formatwarning = formatted


def main(argv: Sequence[str] | None = None) -> int:
    table = commands()
    parser = build_parser(table)
    argv = list(sys.argv[1:] if argv is None else argv)
    if (view := _help_view(parser, table, argv)) is not None and "--help-all" not in argv:
        print(view, end="")
        return 0
    args = _parse(parser, ["--help" if a == "--help-all" else a for a in argv])  # every command takes --help-all
    if args.command is None:
        parser.print_help()
        return 0
    with _one_line_warnings(args.command):
        return _run_command(args, table[args.command])


def _run_command(args: argparse.Namespace, command: Command) -> int:
    config_cls, handler = command.config, command.run
    try:  # options first: a bad one is answered before torch is even imported
        if config_cls is TrainRunConfig:  # --resume takes the run's own settings (fullband.training.resume)
            cfg = train_config(given_values(config_cls, args))
        else:
            cfg = config_from_args(config_cls, args)
    except ConfigError as err:
        return _fail(args.command, err)
    from fullband.data.errors import DataError
    from fullband.devices import apply_threads, resolve_device
    from fullband.model.serialization import CheckpointError
    from fullband.training.errors import TrainingError

    try:
        if hasattr(cfg, "device"):  # one check for every command, before anything is loaded
            device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
            if not getattr(config_cls, "DEVICE_PER_PROCESS", False):  # else each process resolves "auto" itself
                cfg.device = str(device)
        apply_threads(cfg.threads)  # every command has the option: torch's thread count is never left to chance
        handler(cfg)
    except (ConfigError, CheckpointError, DataError, TrainingError) as err:
        return _fail(args.command, err)
    except (ValueError, OSError) as err:  # bad input that reached a library call; FULLBAND_TRACEBACK=1 shows where
        if os.environ.get("FULLBAND_TRACEBACK"):
            raise
        return _fail(args.command, err)
    except KeyboardInterrupt:
        return 130
    return 0


def _fail(command: str, err: Exception) -> int:
    """One line on stderr (the first line of the message), exit status 2."""
    text = str(err).strip()
    print(f"fullband {command}: error: {text.splitlines()[0] if text else type(err).__name__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
