"""``validate``'s declarations (``--conventions``, ``--layout``, ``--mask-kind``) on hostile or
mistaken use: a key given twice, or a declaration the model contradicts, is answered at once
(a one-line usage error, or the interface's FAIL saying so), never by every property failing
slowly under a reading the model does not compute."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mha_verify.cli import main
from mha_verify.properties.onnx.reading import parse_conventions, read_layout, read_mask_kind
from tests.test_validate_layouts import LK, LQ, SEQ, B, D, _export, _Mha

#: seconds a prompt answer may take on a loaded 2-core machine (imports, a session, the mask probe);
#: before, these declarations ran every property to its shrunk failure: minutes
PROMPT = 60.0


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference layer as ``mha-verify export`` writes it (batch-first, keep-mask, its metadata),
    without export's own validation."""
    from mha_verify.export.onnx_export import export_onnx
    from mha_verify.properties.targets.eager import load_target

    path = tmp_path_factory.mktemp("declarations") / "ref.onnx"
    export_onnx(load_target().build(16, 4, seed=0), path, exporter="torchscript")
    return path


@pytest.fixture(scope="module")
def torch_seq_first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch MHA seq-first with a key padding mask, no metadata: q and k share B on axis 1."""
    module = _Mha(batch_first=False, padding=True)
    q, k = torch.randn(LQ, B, D), torch.randn(LK, B, D)
    return _export(module, tmp_path_factory.mktemp("declarations") / "sf.onnx",
                   (q, k, k, torch.zeros(B, LK, dtype=torch.bool)), ["query", "key", "value", "key_padding_mask"],
                   {**SEQ, "key_padding_mask": {0: "b", 1: "lk"}})


def _validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str, float]:
    capsys.readouterr()
    start = time.perf_counter()
    code = main(["validate", *argv])
    wall = time.perf_counter() - start
    out, err = capsys.readouterr()
    return code, out, err, wall


def _one_line(err: str) -> None:
    __tracebackhide__ = True
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, f"stderr should be one line, got {err!r}"


@pytest.mark.parametrize(("text", "message"), [
    ("fully_masked=zeros,fully_masked=nan", "--conventions gives fully_masked twice (fully_masked='zeros' and "
                                            "fully_masked='nan')"),
    ("scale=0.5, causal=true, scale=0.5", "--conventions gives scale twice (scale='0.5' and scale='0.5')"),
], ids=["two-values", "same-value"])
def test_a_key_given_twice_is_refused_naming_the_key_and_both_values(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_conventions(text)


def test_a_conventions_key_given_twice_is_a_prompt_usage_error(reference: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err, wall = _validate(capsys, str(reference), "--profile", "quick",
                                   "--conventions", "fully_masked=zeros,fully_masked=nan")
    assert code == 2, err
    assert "fully_masked twice" in err and "'zeros'" in err and "'nan'" in err, err
    _one_line(err)
    assert wall < PROMPT, wall


@pytest.mark.parametrize(("model", "layout", "says"), [
    ("reference", "seq-first", "is batch-first (mha-verify's export metadata)"),
    ("torch_seq_first", "batch-first", "is seq-first (query and key share axis 1 ('b') but not axis 0)"),
], ids=["export-metadata", "shared-axes"])
def test_a_layout_the_model_contradicts_is_a_prompt_usage_error(model: str, layout: str, says: str,
                                                                request: pytest.FixtureRequest,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = request.getfixturevalue(model)
    code, out, err, wall = _validate(capsys, str(path), "--n-head", "4", "--profile", "quick", "--layout", layout)
    assert code == 2, out + err
    assert f"--layout {layout} contradicts the model" in err and says in err, err
    _one_line(err)
    assert wall < PROMPT, wall


def test_a_mask_kind_the_model_contradicts_fails_promptly_saying_so(reference: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # the reference keeps where True: declared drop, the mask probe sees keep, and no property is
    # judged under the declared kind (each would fail for the declaration, after shrinking)
    code, out, err, wall = _validate(capsys, str(reference), "--profile", "ci", "--mask-kind", "drop")
    assert code == 1, out + err
    assert "read as drop (declared), but on 4 probe examples the model computes it as keep" in out, out
    assert "no check was run under a reading the model contradicts" in out, out
    assert "0 passed, 1 failed" in out, out
    assert wall < PROMPT, wall


def test_axis_names_only_suggest_so_a_declaration_overrides_them() -> None:
    # no key, no mask, no metadata: only the name 'batch' speaks, and a declaration may say otherwise
    assert read_layout(("q", ("batch", "n", 16)), None, None, {}, {"layout": "seq-first"}) == ("seq-first",
                                                                                              "declared")
    # an invalid metadata value is what the declaration replaces, not a contradiction
    assert read_layout(("q", ("a", "b", 16)), None, None, {"layout": "sideways"}, {"layout": "seq-first"}) == (
        "seq-first", "declared")
    with pytest.raises(ValueError, match=r"--layout batch-first contradicts the model: .* metadata 'layout' is "
                                         r"'seq_first'"):
        read_layout(("q", ("a", "b", 16)), None, None, {"layout": "seq_first"}, {"layout": "batch-first"})


def test_a_mask_kind_contradicting_the_metadata_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--mask-kind drop contradicts the model: the metadata 'mask_kind' of mask "
                                         r"input m \(bool\) is 'keep'"):
        read_mask_kind("m", True, {"mask_kind": "keep"}, {"mask_kind": "drop"})
    assert read_mask_kind("key_padding_mask", True, {}, {"mask_kind": "keep"})[:2] == ("keep", "declared")
