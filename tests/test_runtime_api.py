"""RoundPipe's public surface: signatures against upstream's facts, delegation, errors."""

import inspect
import json
import pathlib

import pytest
import torch

import roundpipe
from roundpipe import OptimizerCtx, RoundPipe, RoundPipeRunConfig

UPSTREAM = json.loads((pathlib.Path(__file__).parent / "data" / "roundpipe_upstream_api.json").read_text())
ENTRIES = {entry["qualname"]: entry for entry in UPSTREAM["entries"]}


def _resolve(qualname):
    obj = roundpipe
    for part in qualname.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _default_text(param):
    if param.default is inspect.Parameter.empty:
        return None
    if callable(param.default) and getattr(param.default, "__name__", "") == "_default_loss_fn":
        return "<lambda (outputs, labels) -> outputs>"
    return repr(param.default)


def _ours(func, skip_first):
    params = list(inspect.signature(func).parameters.values())
    return [(p.name, p.kind.name, _default_text(p)) for p in params[1 if skip_first else 0 :]]


def _theirs(parameters, skip_first):
    return [(p["name"], p["kind"], p["default"]) for p in parameters[1 if skip_first else 0 :]]


def test_public_names_match_upstream():
    assert sorted(roundpipe.__all__) == sorted(UPSTREAM["roundpipe___all__"])
    assert sorted(roundpipe.optim.__all__) == sorted(UPSTREAM["roundpipe_optim___all__"])


CLASS_METHODS = [
    (q, m["name"])
    for q in ("roundpipe.RoundPipe", "roundpipe.RoundPipeRunConfig", "roundpipe.GradScaler", "roundpipe.optim.Adam")
    for m in ENTRIES[q]["methods"]
    if m["name"] not in ("update_kernel", "__setstate__")  # upstream internals
]


@pytest.mark.parametrize("qualname, method", CLASS_METHODS, ids=[f"{q}.{m}" for q, m in CLASS_METHODS])
def test_method_signature_matches_upstream(qualname, method):
    facts = next(m for m in ENTRIES[qualname]["methods"] if m["name"] == method)
    if method == "update" and "git_HEAD_variant" in facts:
        facts = facts["git_HEAD_variant"]  # the documented API, with is_async
    ours = _ours(getattr(_resolve(qualname), method), skip_first=True)
    theirs = _theirs(facts["parameters"], skip_first=True)
    assert ours[: len(theirs)] == theirs
    assert all(kind == "KEYWORD_ONLY" for _, kind, _ in ours[len(theirs) :])  # only keyword-only extras


@pytest.mark.parametrize(
    "qualname",
    [
        "roundpipe.wrap_model_to_roundpipe",
        "roundpipe.save_for_recompute",
        "roundpipe.doing_recompute",
        "roundpipe.get_recompute_data",
    ],
)
def test_function_signature_matches_upstream(qualname):
    assert _ours(_resolve(qualname), skip_first=False) == _theirs(ENTRIES[qualname]["parameters"], False)


def test_model_execute_plan_surface():
    plan = roundpipe.ModelExecutePlan.auto("train", object())
    plan.check_valid(1, "train")
    assert [p.name for p in inspect.signature(roundpipe.ModelExecutePlan.auto).parameters.values()] == [
        "run_type",
        "models",
        "min_stages",
        "upper_threshold",
        "model_memory_limit",
    ]
    with pytest.raises(ValueError):
        plan.check_valid(2, "train")


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_attribute_delegation_and_wrapped_module():
    net = _net()
    net.custom = "hello"
    model = RoundPipe(net)
    assert model.model is net and model.custom == "hello"
    model.custom = "changed"
    assert net.custom == "changed"
    model.extra = 5
    assert net.extra == 5
    del model.extra
    assert not hasattr(net, "extra")
    assert list(model.state_dict()) == [f"model.{k}" for k in net.state_dict()]
    assert model.name.endswith(".py:" + str(inspect.currentframe().f_lineno - 9))
    model.eval()
    assert not net.training and not model.training


def test_optim_parameters_are_copies_named_like_upstream():
    net = _net()
    net[2].bias.requires_grad_(False)
    model = RoundPipe(net.half(), optim_dtype=torch.float32)
    named = list(model.optim_named_parameters())
    assert [n for n, _ in named] == ["model.0.weight", "model.0.bias", "model.2.weight"]
    assert all(p.dtype == torch.float32 for _, p in named)
    assert all(c is not p for (_, c), p in zip(named, net.parameters()))
    assert list(model.optim_parameters())[0] is named[0][1]  # created once, reused
    with OptimizerCtx():
        with OptimizerCtx():
            pass
        assert list(model.parameters()) == [p for _, p in named]  # nesting-safe
    assert list(model.parameters())[0] is net[0].weight


def test_step_function_sees_optimizer_copies_via_model_parameters():
    model = RoundPipe(_net())
    copies = list(model.optim_parameters())
    model.forward_backward(input_args=(torch.randn(5, 4),), loss_fn=lambda out, _: out.sum())
    seen = []
    model.step(lambda: seen.extend(model.parameters()), is_async=False)
    assert seen == copies


def test_run_config_repr_and_validation():
    assert repr(RoundPipeRunConfig()) == "RoundPipeRunConfig()"
    assert "num_microbatch=2" in repr(RoundPipeRunConfig(num_microbatch=2))
    with pytest.raises(ValueError):
        RoundPipeRunConfig(num_microbatch=0)


def test_bad_use_raises_clear_errors():
    with pytest.raises(TypeError, match="nn.Module"):
        RoundPipe(lambda x: x)
    with pytest.raises(ValueError, match="pin_model"):
        RoundPipe(_net(), pin_model="yes")
    model = RoundPipe(_net())
    x = torch.randn(5, 4)
    with torch.no_grad(), pytest.raises(RuntimeError, match="grad mode"):
        model.forward_backward(input_args=(x,), loss_fn=lambda o, _: o.sum())
    with pytest.raises(ValueError, match="scalar"):
        model.forward_backward(input_args=(x,), loss_fn=lambda o, _: o)
    with pytest.raises(TypeError, match="floating"):
        model.forward_backward(input_args=(x,), loss_fn=lambda o, _: o.sum().long())
    with pytest.raises(TypeError, match="scalar tensor"):
        model.forward_backward(input_args=(x,), loss_fn=lambda o, _: 3.0)
    with pytest.raises(RuntimeError, match="detached"):
        model.forward_backward(input_args=(x,), loss_fn=lambda o, _: o.sum().detach())
    with pytest.raises(RuntimeError, match="optimizer copies were never created"):
        model.step(lambda: None)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    with pytest.raises(TypeError, match="callable"):
        model.step(opt)
    with pytest.raises(TypeError, match="is_async must be a bool"):
        model.step(lambda o: o.step(), opt)
    with torch.no_grad(), pytest.raises(RuntimeError, match="requires_grad=True"):
        model(x, roundpipe_run_config=RoundPipeRunConfig(requires_grad=True))


def test_recompute_helpers_on_one_device():
    roundpipe.save_for_recompute(torch.ones(1))
    assert roundpipe.doing_recompute() is False
    with pytest.raises(RuntimeError, match="recompute"):
        roundpipe.get_recompute_data()


def test_wrap_model_to_roundpipe_wraps_the_whole_model():
    wrapped = roundpipe.wrap_model_to_roundpipe(_net(), optim_dtype=torch.float64)
    assert isinstance(wrapped, RoundPipe) and wrapped.optim_dtype == torch.float64
