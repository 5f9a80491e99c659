"""``fullband eval``: run lm-evaluation-harness tasks on a checkpoint and save the results.

    out_dir/
      results.json   lm-eval's results (metrics per task, config, versions, n-shot) and this run's options
      samples.json   every request and response, with ``log_samples=true``
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fullband import rundir
from fullband.config import ConfigError
from fullband.evaluation.config import LmEvalConfig
from fullband.files import write_json


def run_lm_eval(cfg: LmEvalConfig) -> tuple[dict[str, Any], str]:
    """Evaluate ``cfg.tasks`` through the ``fullband`` lm-eval model -> (results, printable table)."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable, make_table

    import fullband.evaluation.adapter as adapter  # registers the "fullband" model name
    from fullband.families import checkpoint_dir

    if not checkpoint_dir(cfg.checkpoint).is_dir():
        raise ConfigError(f"checkpoint={cfg.checkpoint!r} is invalid: no such directory")
    if cfg.include_path is not None and not Path(cfg.include_path).is_dir():
        raise ConfigError(f"include_path={cfg.include_path!r} is invalid: no such directory")
    task_manager = TaskManager(include_path=cfg.include_path, include_defaults=cfg.include_defaults)
    unknown = [t for t in cfg.tasks if t not in task_manager.all_tasks]
    if unknown:
        raise ConfigError(f"tasks={list(cfg.tasks)!r}: unknown task(s) {unknown}"
                          + ("" if cfg.include_path else "; local task YAMLs need --include_path DIR"))
    d = cfg.decode
    model = adapter.FullbandLM(
        cfg.checkpoint, mode=d.mode, exact_chunk_size=d.exact_chunk_size,
        temperature=d.temperature, top_k=d.top_k, top_p=d.top_p, seed=d.seed, stop_token_ids=d.stop_token_ids,
        batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype, max_gen_toks=cfg.max_gen_toks,
    )
    results = lm_eval.simple_evaluate(
        model=model, tasks=list(cfg.tasks), num_fewshot=cfg.num_fewshot, limit=cfg.limit,
        task_manager=task_manager, log_samples=cfg.log_samples, random_seed=cfg.seed, numpy_random_seed=cfg.seed,
        torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed, bootstrap_iters=1000,
    )
    samples = results.pop("samples", None)
    results["fullband"] = dataclasses.asdict(cfg)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / rundir.RESULTS, results, default=handle_non_serializable)
    if samples is not None:
        write_json(out_dir / "samples.json", samples, default=handle_non_serializable)
    return results, make_table(results)
