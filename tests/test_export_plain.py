"""The reference exports with *plain* ``torch.onnx.export`` under both of torch's exporters,
without mha-verify's wrapper: what a deployment script does."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mha_verify.mha import MultiHeadAttention


@pytest.mark.parametrize("dynamo", [pytest.param(False, id="torchscript"),
                                    pytest.param(True, id="dynamo")])
def test_reference_exports_with_plain_torch_onnx_export(tmp_path: Path, dynamo: bool) -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4).eval()
    q, k, v = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    mask = torch.rand(2, 1, 3, 5) < 0.7
    mask[0, 0, 1] = False  # one fully masked row: w_o.bias in eager and in the graph
    path = tmp_path / "plain.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (q, k, v, mask), str(path), dynamo=dynamo)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert len(names) == 4, f"inputs={names}, but should be q, k, v and the mask"
    got = session.run(None, dict(zip(names, (q.numpy(), k.numpy(), v.numpy(), mask.numpy()), strict=True)))[0]
    with torch.no_grad():
        want = m(q, k, v, mask).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
