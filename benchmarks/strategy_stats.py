"""How the strategies' draws are distributed: the features that decide what bugs they can reach.

    python -m benchmarks.strategy_stats [--public N]

Prints, as percentages, for the public ``attention_examples()`` (N random draws) and for the
examples the ``ci`` profile feeds a few properties of the reference (recorded inside the
runner, derandomized: exactly what the gate sees): Lk = 1; lengths past 8, 16, 32, 64, 128 and 256; B >= 8; H >= 16;
Hd >= 128; D >= 1024; additive masks with finite large negatives; key-padding masks; masks
that differ per item; a fully masked item next to live ones; batches mixing 1e-3 and 1e3.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from hypothesis import given
from hypothesis import settings as Settings

from mha_verify.mha.masks import full_keep
from mha_verify.properties.engine import profiles, runner
from mha_verify.properties.engine.registry import Property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.strategies.examples import AttnExample, attention_examples
from mha_verify.properties.targets.eager import Target, load_target

FEATURES: dict[str, Callable[[AttnExample], bool]] = {
    "Lk = 1": lambda ex: ex.sizes.lk == 1,
    "max(Lq, Lk) > 8": lambda ex: max(ex.sizes.lq, ex.sizes.lk) > 8,
    "Lk > 16": lambda ex: ex.sizes.lk > 16,
    "Lk > 32": lambda ex: ex.sizes.lk > 32,
    "Lq > 16": lambda ex: ex.sizes.lq > 16,
    "max(Lq, Lk) > 64": lambda ex: max(ex.sizes.lq, ex.sizes.lk) > 64,
    "max(Lq, Lk) > 128": lambda ex: max(ex.sizes.lq, ex.sizes.lk) > 128,
    "max(Lq, Lk) > 256": lambda ex: max(ex.sizes.lq, ex.sizes.lk) > 256,
    "B >= 8": lambda ex: ex.sizes.batch >= 8,
    "H >= 16": lambda ex: ex.sizes.n_head >= 16,
    "H > 4": lambda ex: ex.sizes.n_head > 4,
    "Hd >= 128": lambda ex: ex.sizes.head_dim >= 128,
    "Hd > 64": lambda ex: ex.sizes.head_dim > 64,
    "D >= 1024": lambda ex: ex.sizes.d_model >= 1024,
    "finite large negative mask": lambda ex: ex.mask_spec.kind != "none" and ex.mask_spec.convention == "float_large",
    "key padding (B, 1, 1, Lk)": lambda ex: ex.mask is not None and ex.mask_spec.form == "B11L",
    "mask differs per item": lambda ex: ex.mask is not None and ex.mask.dim() == 4 and ex.mask.shape[0] > 1
    and not bool((ex.mask == ex.mask[:1]).all()),
    "a fully masked item next to live ones": lambda ex: ex.sizes.batch > 1 and _fully_masked_item(ex),
    "1e-3 and 1e3 in one batch": lambda ex: 1e-3 in ex.scales and 1e3 in ex.scales,
}


def _fully_masked_item(ex: AttnExample) -> bool:
    keep = full_keep(ex.mask, ex.sizes.mask_target())
    has_key = keep.flatten(1).any(dim=1)  # (B,)
    return bool((~has_key).any()) and bool(has_key.any())


def _collect(strategy: object, settings: Settings) -> list[AttnExample]:
    seen: list[AttnExample] = []

    @settings
    @given(strategy)
    def draw(ex: AttnExample) -> None:
        seen.append(ex)

    draw()
    return seen


def _fed_by_runner(prop: Property, target: Target) -> list[AttnExample]:
    """The examples ``run_property`` feeds ``prop`` at ``ci`` (random phase and boundary sweep):
    recorded on their way into the check, so this is exactly what the gate sees."""
    fed: list[AttnExample] = []
    runner.run_property(prop, target, settings=profiles.PROFILES["ci"], observer=lambda ex, _: fed.append(ex))
    return fed


def _percent(examples: list[AttnExample]) -> dict[str, float]:
    n = max(1, len(examples))
    return {name: 100.0 * sum(f(ex) for ex in examples) / n for name, f in FEATURES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--public", type=int, default=2000, help="random draws of attention_examples()")
    parser.add_argument("--properties", default="oracle_agreement,batch_independence,masked_kv_invariance",
                        help="properties whose ci examples to count")
    args = parser.parse_args()
    torch.set_num_threads(1)
    columns: dict[str, dict[str, float]] = {}
    public = _collect(attention_examples(), Settings(max_examples=args.public, database=None, deadline=None))
    columns[f"public ({len(public)})"] = _percent(public)
    target = load_target(None)
    for name in args.properties.split(","):
        drawn = _fed_by_runner(all_properties()[name], target)
        columns[f"ci {name} ({len(drawn)})"] = _percent(drawn)
    names = list(columns)
    print("| feature | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for feature in FEATURES:
        print(f"| {feature} | " + " | ".join(f"{columns[c][feature]:.1f} %" for c in names) + " |")


if __name__ == "__main__":
    main()
