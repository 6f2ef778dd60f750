"""``mha-verify export`` and ``mha-verify validate``: exit codes 0/1/2, files written or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_verify.cli import main

pytestmark = pytest.mark.deep  # exports and validates whole models through the CLI (tox -e deep)

FROZEN = '''
from torch import nn
from mha_verify.mha import MultiHeadAttention


class Frozen(MultiHeadAttention):
    """The reference, but its batch size turns into a constant when traced."""

    def forward(self, q, k, v, mask=None, need_weights=False):
        B = int(q.size(0))
        return super().forward(q.reshape(B, q.shape[1], q.shape[2]), k, v, mask)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "ref.onnx"
    assert main(["export", "--d-model", "16", "--n-head", "4", "--exporter", "torchscript", "--profile", "ci",
                 "-o", str(out)]) == 0
    return out


@pytest.mark.serial
def test_export_writes_a_validated_model(model: Path) -> None:
    """The file computes what the reference with the same weights (--weight-seed 0) computes, held
    in onnxruntime against the float64 oracle with the derived tolerance, independently of export's
    own validation; and it carries the interface export documents (q, k, v, a bool mask)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from mha_verify.mha.reference import multi_head
    from mha_verify.mha.tolerance import compare
    from mha_verify.properties.targets.eager import load_target

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["q", "k", "v", "mask"]
    eager = load_target().build(16, 4, seed=0)
    gen = torch.Generator().manual_seed(5)
    for B, Lq, Lk in ((1, 1, 1), (3, 7, 19), (2, 33, 5)):
        q, k, v = (torch.randn(B, L, 16, generator=gen) for L in (Lq, Lk, Lk))
        keep = torch.rand(B, 1, Lq, Lk, generator=gen) < 0.7
        keep[..., 0] = True  # no fully masked row: their convention is checked by fully_masked_rows
        got = session.run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "mask": keep.numpy()})[0]
        oracle, _ = multi_head(q, k, v, eager.params(), 4, keep)
        same = eager(q, k, v, keep).detach()
        comparison = compare(torch.from_numpy(np.asarray(got)), oracle, same, torch.float32)
        assert comparison.ok, (B, Lq, Lk, str(comparison))


@pytest.mark.serial
def test_validate_exit_codes(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(model), "--profile", "ci", "--no-isolation"]) == 0
    assert "0 failed" in capsys.readouterr().out
    other_weights = ["--target", "mha_verify.mha:MultiHeadAttention", "--weight-seed", "3"]  # not the model's weights
    assert main(["validate", str(model), "--profile", "quick", "--no-isolation", *other_weights]) == 1
    for argv, message in [
        (["validate", str(tmp_path / "missing.onnx")], "does not exist"),
        (["validate", str(tmp_path / "junk.onnx")], "is not an ONNX model"),
        (["validate", str(model), "--providers", "cuda"], "available: cpu"),
    ]:
        (tmp_path / "junk.onnx").write_text("not a model")
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.serial
def test_validate_isolated_by_default(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(model), "--profile", "ci"]) == 0


@pytest.mark.serial
def test_export_that_fails_validation_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "frozen.py"
    spec.write_text(FROZEN)
    out = tmp_path / "frozen.onnx"
    code = main(["export", "--target", f"{spec}:Frozen", "--d-model", "16", "--n-head", "4", "--exporter",
                 "torchscript", "--profile", "quick", "--bundle-dir", str(tmp_path / "b"), "-o", str(out)])
    assert code == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b", "frozen.py"]
    assert "was not written" in capsys.readouterr().err
    assert any((tmp_path / "b").glob("*/replay.py"))


@pytest.mark.serial
def test_export_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.onnx"
    for extra, message in [(["--opset", "16"], "opset=16"), (["--target", "nope:X"], "cannot import"),
                           (["--weights", str(tmp_path / "w.pt")], "does not exist")]:
        assert main(["export", "--d-model", "16", "--n-head", "4", "--exporter", "torchscript", *extra,
                     "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not out.exists()


@pytest.mark.serial
@pytest.mark.parametrize("argv", [
    pytest.param(["export", "--d-model", "16", "--n-head", "4", "-o", "m.onnx", "--seed", "3"], id="export"),
    pytest.param(["validate", "m.onnx", "--seed", "3"], id="validate"),
])
def test_seed_is_the_hypothesis_seed_so_weights_take_weight_seed(argv: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--seed is the Hypothesis seed of `check`; the seed of the target's weights is --weight-seed" in err
