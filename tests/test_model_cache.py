"""A decoder exported with its KV cache: prefill then decode gives the full forward
(``cache_consistency``), held on a correct tiny decoder and failed by its twin whose decode step's
causal mask is aligned top-left (tests/fixtures/decoder_models.py); the step schedule itself."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.properties.model.cache import spans

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/decoder_models.py"
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import decoder_models  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decoders")
    return {"decoder": decoder_models.export(decoder_models.decoder(), folder / "decoder.onnx"),
            "top_left": decoder_models.export(decoder_models.top_left(), folder / "top_left.onnx")}


def _validate(model: Path, eager: str, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(model), "--eager",
                           f"{FIXTURE}:{eager}", "--profile", "ci", *more],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _verdict(stdout: str, check: str) -> str:
    rows = [line.split() for line in stdout.splitlines() if line.startswith(f"  {check} ")]
    assert len(rows) == 1, stdout
    return rows[0][2]


def test_the_schedule_is_a_prefill_single_tokens_and_a_chunk() -> None:
    assert spans(9, 0) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 9)]
    assert spans(9, 6) == [(0, 7), (7, 8), (8, 9)]
    assert spans(2, 5) == [(0, 1), (1, 2)]
    assert spans(6, 0, least=3, chunk=False) == [(0, 3), (3, 4), (4, 5), (5, 6)]
    for width in range(2, 40):  # every position fed once, in order, whatever the seed
        for seed in range(0, 50, 7):
            steps = spans(width, seed)
            assert steps[0][0] == 0 and steps[-1][1] == width
            assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(steps))
    with pytest.raises(ValueError, match="width=1"):
        spans(1, 0)


@pytest.mark.deep
def test_a_decoder_with_its_cache_passes_every_relation(exported: dict[str, Path]) -> None:
    done = _validate(exported["decoder"], "decoder")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KV cache: 4 tensors (past_key_values.0.key -> present.0.key, ...)" in done.stdout
    for check in ("outputs_agree", "padding_invariance", "batch_independence", "fully_padded_finite",
                  "cache_consistency"):
        assert _verdict(done.stdout, check) == "ok", done.stdout


@pytest.mark.integration
def test_a_decode_step_whose_causal_mask_is_aligned_top_left_fails_the_cache_relation(
        exported: dict[str, Path], tmp_path: Path) -> None:
    """The twin's full forward is the decoder's (every other relation holds): only prefill + decode
    shows the misaligned mask, shrunk to one token decoded after a cache of one, which sees key 0 and
    not itself: one position off."""
    done = _validate(exported["top_left"], "top_left", "--bundle-dir", str(tmp_path / "bundles"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert _verdict(done.stdout, "cache_consistency") == "FAIL", done.stdout
    assert _verdict(done.stdout, "outputs_agree") == "ok", done.stdout
    assert "fed after a cache of 1 position vs the full forward" in done.stdout, done.stdout
    # the bundle replays the failing decode step (its cache in the feed) with onnxruntime and numpy alone
    folder = tmp_path / "bundles" / "model_cache_consistency"
    assert f"replay:  python {folder / 'replay.py'}" in done.stdout, done.stdout
    replayed = subprocess.run([sys.executable, "-I", str(folder / "replay.py")], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "'past_key_values.0.key'=(1, 2, 1, 8)" in replayed.stdout and "max error" in replayed.stdout


def test_an_encoder_without_a_cache_is_not_applicable_with_the_reason() -> None:
    from mha_verify.properties.model.cache import why_not
    from mha_verify.properties.model.inputs import ModelInputs

    class Holder:
        inputs = ModelInputs({"input_ids": "input_ids"}, ("last_hidden_state",))

    assert why_not(Holder()) == "the graph takes no past key/values (no KV cache to decode with)"  # type: ignore[arg-type]
