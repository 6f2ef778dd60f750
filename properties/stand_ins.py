"""Stand-ins for packages whose wheels do not load here, so that a library importing them at module level
for what its attention layers never use can still be verified.

torchvision's and torchaudio's PyPI wheels for this torch are CUDA builds: their ``_C`` extension links to
``libtorch_cuda``, and with the CPU torch ``import torchvision`` raises (``operator torchvision::nms does not
exist``). vit-pytorch's LeViT-JEPA imports ``torchvision.transforms``, its VAAT ``torchaudio.transforms``,
open_clip's utilities ``torchvision.ops``: for image and audio preprocessing, never inside an attention
layer. While such a module is imported, every ``torchvision.*`` and ``torchaudio.*`` import gives a
:class:`StandIn`: any attribute is another stand-in, and calling one raises, naming it, so a layer that does
use the package fails at that call with its name. The stand-ins leave ``sys.modules`` once the import is done
(a later ``import torchvision`` fails as it would have), and the harness says it used them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Sequence

#: packages whose PyPI wheels for our torch are CUDA builds that do not load with the CPU torch
CUDA_ONLY_WHEELS = ("torchvision", "torchaudio")


class StandIn(types.ModuleType):
    """A module (or anything under it) of a package that does not load here: attributes are stand-ins, and
    a call raises naming it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: ``import torchvision.ops.misc`` finds its submodules

    def __getattr__(self, name: str) -> StandIn:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandIn(f"{self.__name__}.{name}")

    def __call__(self, *args: object, **kwargs: object) -> None:
        top = self.__name__.split(".")[0]
        raise RuntimeError(f"{self.__name__} is a stand-in: {top}'s wheel does not load with this torch, and the "
                           "target was imported without it")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        """A base class (pytorch-fid's ``class FIDInceptionA(torchvision.models.inception.InceptionA)``,
        imported by denoising-diffusion-pytorch): a class of its name whose construction raises, naming it."""
        stand_in = self

        def refuse(self: object, *args: object, **kwargs: object) -> None:
            stand_in()

        name = self.__name__.rpartition(".")[2]
        return (type(name, (), {"__init__": refuse, "__qualname__": name, "__module__": self.__name__}),)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = tuple(packages)

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def missing_wheel(exc: BaseException) -> str | None:
    """The package of :data:`CUDA_ONLY_WHEELS` an import error names (``No module named 'torchvision'``, or
    torchvision's own ``operator torchvision::nms does not exist``), or None."""
    text = str(exc)
    return next((p for p in CUDA_ONLY_WHEELS if p in text), None)


def _drop(packages: Sequence[str]) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in packages]:
        del sys.modules[name]


@contextlib.contextmanager
def standing_in(packages: Sequence[str] = CUDA_ONLY_WHEELS) -> Iterator[None]:
    """Every import of ``packages`` (and their submodules) inside the block gives a :class:`StandIn`; what a
    failed import of the real ones left in ``sys.modules`` is dropped first, the stand-ins after."""
    _drop(packages)
    finder = _Finder(packages)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        _drop(packages)


__all__ = ["CUDA_ONLY_WHEELS", "StandIn", "missing_wheel", "standing_in"]
