"""Building a layer with no user code (``properties.adapters.construction``): parameters by name, the
library's own config class with the sizes set after its validation, and one forward at load."""

from __future__ import annotations

import pytest
import torch

from mha_verify.properties.adapters import construction
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target
from tests.fixtures import constructors, option_namespaces

FIXTURE = "tests/fixtures/constructors.py:"


def test_a_config_and_a_required_layer_index_get_the_librarys_config_with_the_sizes_set_after_validation() -> None:
    target = load_target(FIXTURE + "ToyAttention")
    assert target.built_as == ("ToyAttention(layer_idx=0, config=ToyConfig(hidden_size=8, num_attention_heads=2, "
                               "num_key_value_heads=1, head_dim=4))")
    bound = target.build(12, 3)
    assert (bound.module.d_model, bound.module.n_head, bound.module.kv_heads) == (12, 3, 3)


@pytest.mark.parametrize("layer", ["ToyStringAnnotated", "ToyUnionAnnotated"])
def test_of_the_configs_an_annotation_names_the_first_that_builds_is_used(layer: str) -> None:
    target = load_target(FIXTURE + layer)
    assert f"{layer}(config=ToyVisionConfig(" in target.built_as
    assert target.build(16, 4).module.d_model == 16


def test_sizes_go_by_name_with_the_head_width_a_layer_asks_for() -> None:
    target = load_target(FIXTURE + "KeywordAttention")
    assert target.built_as == "KeywordAttention(query_dim=8, heads=2, dim_head=4)"
    assert target.build(12, 3).module.n_head == 3


def test_an_optional_config_that_forward_needs_is_given() -> None:
    # BartAttention(d, h) builds with config=None and then raises on every forward
    target = load_target(FIXTURE + "SizesAndConfig")
    assert target.built_as.startswith("SizesAndConfig(embed_dim=8, num_heads=2, config=ToyConfig(")
    x = torch.randn(2, 5, 8)
    assert target.build(8, 2)(x, x, x).shape == (2, 5, 8)


def test_unnamed_parameters_are_passed_as_d_model_then_n_head() -> None:
    plan = construction.plans(constructors.Unnamed)
    assert [p.positional for p in plan] == [True]
    assert load_target(FIXTURE + "Unnamed").built_as == "Unnamed(8, 2)"


def test_a_layer_whose_forward_always_raises_is_one_usage_error_naming_the_exception() -> None:
    with pytest.raises(TargetError, match=r"one forward at \(d_model=8, n_head=2\) on q = k = v of shape \(2, 3, 8\), "
                                          r"no mask, raised RuntimeError: no kernel for this device"):
        load_target("tests/fixtures/bad_targets.py:AlwaysRaises")


def test_a_layer_built_from_its_library_config_is_verified() -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "ToyAttention"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0, result


def test_causality_stated_in_a_diffusers_style_processor_is_read() -> None:
    target = load_target("tests/fixtures/kv_layers.py:ProcessorLayer")
    conv = target.build(8, 2).conventions
    assert conv.causal and "causal from is_causal=True in its processor" in conv.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0, result


def test_joint_attention_is_verified_as_self_attention_not_as_keys_and_values() -> None:
    # read as keys = values, its context would be drawn as k = v != q, and joint attention is not that
    target = load_target("tests/fixtures/kv_layers.py:JointAttention")
    conv = target.build(8, 2).conventions
    assert not conv.cross_attention and not conv.kv_shared
    assert "joint attention: encoder_hidden_states is concatenated to hidden_states" in conv.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0, result


def test_a_rank_4_mask_layout_draws_no_2d_mask_and_lifts_the_causal_one() -> None:
    from mha_verify.properties.adapters.signature import MaskFormat

    fmt = MaskFormat("keep", layout="BHLL4")
    assert "LL" not in fmt.forms and {"B1LL", "11LL", "B11L", "BHLL"} <= fmt.forms
    lifted = fmt.convert(None, B=2, Lq=3, Lk=3, dtype=torch.float32, causal=True)
    assert lifted is not None and lifted.shape == (1, 1, 3, 3) and bool(lifted[0, 0, 0, 1]) is False


def test_a_config_field_aliased_to_another_keeps_the_heads() -> None:
    config = construction.library_config(constructors.ToyAliasedConfig, 12, 4)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (12, 4, 4)


def test_a_layer_that_runs_only_with_kv_heads_equal_to_heads_is_built_so_and_verified() -> None:
    target = load_target(FIXTURE + "ValuesByQueryHeads")
    assert "num_attention_heads=2, num_key_value_heads=2" in target.built_as
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0, result


def test_a_layer_whose_models_refuse_sdpa_is_built_with_eager() -> None:
    from tests.fixtures import eager_only

    assert not construction.supports_sdpa(eager_only.EagerOnlyAttention)
    assert construction.supports_sdpa(constructors.ToyAttention)  # no *PreTrainedModel of its own: sdpa
    target = load_target("tests/fixtures/eager_only.py:EagerOnlyAttention")
    assert target.build(8, 2).module.implementation == "eager" and "attention eager" in target.built_as


@pytest.mark.parametrize(("layer", "said"), [
    ("AutoCorrelation", "computes through torch.fft"),
    ("ProbSparse", "samples at random"),
    ("BlockLocal", "attends within blocks of block_len keys"),
    ("ChunkedLocal", "attends within chunks and their neighbours"),
    ("HeadSliceRotary", "rotates some of its heads only"),
])
def test_another_operator_than_attention_over_every_key_is_refused(layer: str, said: str) -> None:
    with pytest.raises(TargetError, match=rf"{layer}'s forward {said}.*cannot be verified"):
        load_target("tests/fixtures/odd_layers.py:" + layer)


def test_a_layer_with_a_point_batch_axis_is_built_at_full_width_and_called_with_one_point() -> None:
    target = load_target("tests/fixtures/odd_layers.py:PointBatchAttention")
    assert target.build(8, 8).module.q_proj.out_features == 8  # downsample_rate=1: 8 heads of width 1
    assert "downsample_rate=1" in target.built_as
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples >= 10, result


def test_a_constructor_wrapped_without_functools_wraps_is_read_through_its_closure() -> None:
    """transformers 5.25 with the ``kernels`` package decorates LlamaAttention so that its ``__init__``
    is ``new_init(self, *args, **kwargs)``: read as such, the layer was built as LlamaAttention(8, 2)."""
    import inspect

    from torch import nn

    from mha_verify.properties.adapters.construction import constructor_signature, plans

    def kernelized(cls):  # type: ignore[no-untyped-def]
        init = cls.__init__

        def new_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            init(self, *args, **kwargs)

        cls.__init__ = new_init
        return cls

    @kernelized
    class Wrapped(nn.Module):
        def __init__(self, hidden_size: int, num_heads: int, layer_idx: int) -> None:
            super().__init__()
            self.sizes = (hidden_size, num_heads, layer_idx)

    assert list(inspect.signature(Wrapped).parameters) == ["args", "kwargs"]
    assert list(constructor_signature(Wrapped).parameters) == ["hidden_size", "num_heads", "layer_idx"]
    plan = plans(Wrapped)[0]
    assert not plan.positional and plan.build(8, 2).sizes == (8, 2, 0)


def test_a_channel_count_a_length_and_a_group_norm_count_that_fails_at_its_default_are_filled() -> None:
    # at its default of 32 groups GroupNorm refuses 8 channels: the next plan builds it with one group
    target = load_target(FIXTURE + "GroupNormedChannels")
    assert target.built_as == "GroupNormedChannels(n_channels=8, seq_len=1024, n_heads=2, n_groups=1)"
    first, second = construction.plans(constructors.GroupNormedChannels)
    assert "n_groups" not in dict(first.roles) and dict(second.roles)["n_groups"] == "one"
    module = target.build(16, 4).module
    assert (module.norm.num_groups, module.seq_len) == (1, 1024)


def test_an_args_namespace_of_its_own_fields_and_a_flag_its_default_refuses_are_filled() -> None:
    # the plain namespace lacks ``multiway``, and both flags off fail its assert: the options off, self-attention on
    target = load_target("tests/fixtures/option_namespaces.py:ArgsAndOneFlag")
    assert target.built_as == ("ArgsAndOneFlag(embed_dim=8, num_heads=2, self_attention=True, "
                               "args=<namespace of size fields, any other None>)")
    module = target.build(8, 2).module
    assert module.extra is None
    recipe = construction.choose(option_namespaces.ArgsAndOneFlag, 8, 2)[0].recipe(8, 2)
    assert recipe["kwargs"] == {"embed_dim": 8, "num_heads": 2, "self_attention": True}
    assert recipe["config"]["others_none"] is True  # type: ignore[index]
    verdict = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0).verdict
    assert verdict == "pass"
