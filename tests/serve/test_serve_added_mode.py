"""docs/architecture.md, "Adding a decoding mode", kept honest: two toy modes registered here, as the section says and
with no other module edited, decode through ``fullband.generate`` and through the real server (its schema too),
count their FLOPs, and are gone again afterwards.

``soft_twin`` prefills as soft under its own name; ``deep:K`` takes a pass count and runs ``2K`` extra fused prompt
passes, so it must decode as ``fused:2K`` does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_fixtures import LiveServer, ids_of, save_checkpoint

from fullband import generate
from fullband.config import ConfigError
from fullband.experiments.core.flops import Shape, decode_flops
from fullband.modes import DecodingMode, ModeSpec, Prefill, mode_names, register_mode, unregister_mode

TOYS = (ModeSpec("soft_twin", lambda _: Prefill(1, carries=True), help="soft under another name"),
        ModeSpec("deep", lambda k: Prefill(1 + 2 * k, carries=True), takes_passes=True,
                 help="2K extra fused prompt passes"))
# each toy spelling and the built-in spelling it must decode as
SAME_AS = {"soft_twin": "soft", "deep:1": "fused:2", "deep:2": "fused:4"}
PROMPT = [5, 17, 42, 8, 99, 3, 250]


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory, one_thread_per_module):
    for spec in TOYS:  # what the section says to write: one register_mode call per mode
        register_mode(spec)
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("toy"), with_tokenizer=False)
    live = LiveServer.native(checkpoint, with_tokenizer=False)
    try:
        yield live
    finally:
        live.stop()
        for spec in TOYS:
            unregister_mode(spec.name)


@pytest.mark.parametrize(("toy", "builtin"), SAME_AS.items())
def test_a_registered_mode_decodes_through_generate_and_the_server(toy_server, toy, builtin):
    expected = generate(toy_server.model, PROMPT, 12, builtin)
    assert generate(toy_server.model, PROMPT, 12, toy) == expected
    with toy_server.client() as client:
        answer = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                      "mode": toy})
    assert answer.status_code == 200, answer.text
    assert ids_of(answer.json()["choices"][0]["text"]) == expected[len(PROMPT):]


def test_registered_modes_batch_with_the_others_and_reach_the_schema_and_the_flops(toy_server):
    with toy_server.client() as client:
        pattern = client.get("/openapi.json").json()["components"]["schemas"]["CompletionBody"]["properties"][
            "mode"]["anyOf"][0]["pattern"]
    assert "soft_twin" in pattern and "deep:[0-9]+" in pattern
    modes = [*SAME_AS, *SAME_AS.values(), "standard", "exact"]

    def run(mode: str) -> list[int]:
        with toy_server.client() as client:
            return ids_of(client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 9, "temperature": 0,
                                                               "mode": mode}).json()["choices"][0]["text"])

    with ThreadPoolExecutor(len(modes)) as pool:
        got = dict(zip(modes, pool.map(run, modes), strict=True))
    for toy, builtin in SAME_AS.items():
        assert got[toy] == got[builtin] == generate(toy_server.model, PROMPT, 9, builtin)[len(PROMPT):]
    shape = Shape(d_model=32, n_layers=2, kv_dim=16, ffn_dim=128, vocab_size=257)
    for toy, builtin in SAME_AS.items():
        assert decode_flops(shape, 7, 12, DecodingMode.parse(toy)) == decode_flops(shape, 7, 12,
                                                                                  DecodingMode.parse(builtin))


def test_the_toy_modes_are_gone_once_unregistered(toy_server):
    assert {"soft_twin", "deep"} <= set(mode_names())
    spec = TOYS[0]
    unregister_mode(spec.name)
    try:
        with pytest.raises(ConfigError, match="soft_twin"):
            generate(toy_server.model, PROMPT, 2, "soft_twin")
    finally:
        register_mode(spec)  # the fixture unregisters both at the end

