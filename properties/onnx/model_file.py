"""Loading an ONNX model file that a user hands us, as hostile input: a size limit on the file and
on the external data it names, no external data outside the model's folder, and one-line
:class:`ModelError` for a file that is missing, a directory, or not ONNX.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]


class ModelError(Exception):
    """The file is missing, not ONNX, or not an attention model we can feed (a usage error)."""


#: the most external data (tensors stored beside the model, as dynamo exports write large ones)
#: read into memory, and the largest model file read: a 21 KB model naming a 6 GB file would
#: otherwise be read in full. ``validate --max-external-data-gb`` raises it.
MAX_EXTERNAL_DATA_BYTES = 2 * 2**30


def external_data_bytes(model: onnx.ModelProto, folder: Path) -> int:
    """Bytes of the external data files ``model`` names (each file counted once, as it is on disk);
    ModelError for a file outside the model's folder (a model file must not read other files)."""
    files = set()
    root = folder.resolve()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            location = entries.get("location", "")
            resolved = (root / location).resolve()
            if not resolved.is_relative_to(root) or not location:
                raise ModelError(f"the external data of tensor {tensor.name!r} is {location!r}, which points outside "
                                 f"the model's folder {str(folder)!r}")
            files.add(resolved)
    return sum(f.stat().st_size for f in files if f.is_file())


def load_model(path: str | os.PathLike[str], *, external_data: bool = True,
               max_external_bytes: int | None = None) -> onnx.ModelProto:
    """The model at ``path``; with ``external_data`` its tensors stored beside it too (at most
    ``max_external_bytes``, default :data:`MAX_EXTERNAL_DATA_BYTES`). ModelError (one line) if it is
    missing, not ONNX, or names more external data than allowed."""
    path = Path(path)
    if path.is_dir():
        raise ModelError(f"model file {str(path)!r} is a directory, not an ONNX file")
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist")
    limit = MAX_EXTERNAL_DATA_BYTES if max_external_bytes is None else max_external_bytes
    if path.stat().st_size > limit:
        raise ModelError(f"{str(path)!r} is {path.stat().st_size / 2**30:.2f} GiB, more than the {limit / 2**30:.2f} "
                         "GiB allowed: pass --max-external-data-gb to read it")
    try:
        model = onnx.load(str(path), load_external_data=False)
        size = external_data_bytes(model, path.parent)
        if size > limit:
            raise ModelError(f"{str(path)!r} names {size / 2**30:.2f} GiB of external data, more than the "
                             f"{limit / 2**30:.2f} GiB allowed: pass --max-external-data-gb to read it")
        if external_data:
            onnx.load_external_data_for_model(model, str(path.parent))
    except (DecodeError, ValueError, OSError, RuntimeError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"{str(path)!r} is not an ONNX model: {type(exc).__name__}: {exc}") from None
    if not model.graph.node or not model.graph.output:
        raise ModelError(f"{str(path)!r} is not an ONNX model (no graph)")
    return model
