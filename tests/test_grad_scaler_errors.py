"""Misuse gets torch's exception type and text, whichever thread the scaler work runs on."""

import pytest
import torch

from roundpipe import GradScaler, optim_stream


def _setup(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt


def _backward(scaler, model):
    x = torch.randn(4, 3, dtype=next(model.parameters()).dtype)
    scaler.scale(model(x).float().sum()).backward()


def _misuses():
    def unscale_twice(s, m, o):
        _backward(s, m); s.unscale_(o); s.unscale_(o)

    def unscale_after_step(s, m, o):
        _backward(s, m); s.step(o); s.unscale_(o)

    def step_twice(s, m, o):
        _backward(s, m); s.step(o); s.step(o)

    def update_without_inf_checks(s, m, o):
        _backward(s, m); s.update()

    def update_before_scale(s, m, o):
        s.update()

    def unscale_before_scale(s, m, o):
        s.unscale_(o)

    def step_before_scale(s, m, o):
        s.step(o)

    def closure(s, m, o):
        _backward(s, m); s.step(o, closure=lambda: None)

    def no_grads(s, m, o):
        s.scale(torch.ones(()))
        s.step(o)

    def new_scale_requires_grad(s, m, o):
        _backward(s, m); s.step(o); s.update(torch.ones((), requires_grad=True))

    def new_scale_two_elements(s, m, o):
        _backward(s, m); s.step(o); s.update(torch.ones(2))

    def new_scale_wrong_device(s, m, o):
        _backward(s, m); s.step(o); s.update(torch.ones((), device="meta"))

    def load_empty_state(s, m, o):
        s.load_state_dict({})

    def scale_non_tensor(s, m, o):
        s.scale([torch.ones(()), 3])

    return [v for k, v in locals().items()]


_MAIN_THREAD_ONLY = {  # update() and load_state_dict() belong to the main thread
    "update_without_inf_checks", "update_before_scale", "new_scale_requires_grad",
    "new_scale_two_elements", "new_scale_wrong_device", "load_empty_state",
}
_CASES = [
    pytest.param(misuse, where, id=f"{misuse.__name__}-{where}")
    for misuse in _misuses()
    for where in ("main", "optimizer_thread")
    if where == "main" or misuse.__name__ not in _MAIN_THREAD_ONLY
]


@pytest.mark.parametrize("misuse, where", _CASES)
def test_misuse_raises_torchs_error(misuse, where):
    with pytest.raises(BaseException) as theirs:
        misuse(torch.amp.GradScaler("cpu"), *_setup())
    scaler, (model, opt) = GradScaler(), _setup()
    with pytest.raises(theirs.type) as ours:
        if where == "main":
            misuse(scaler, model, opt)
        else:
            optim_stream.launch(misuse, scaler, model, opt).wait()
    assert str(ours.value) == str(theirs.value)


def test_fp16_grads_are_rejected_before_any_grad_changes():
    torch.manual_seed(0)
    fp32 = torch.nn.Linear(3, 2)
    fp16 = torch.nn.Linear(3, 2).half()
    opt = torch.optim.SGD(list(fp32.parameters()) + list(fp16.parameters()), lr=0.1)
    scaler = GradScaler(4.0)
    loss = scaler.scale(fp32(torch.randn(2, 3)).sum() + fp16(torch.randn(2, 3).half()).float().sum())
    loss.backward()
    before = [p.grad.clone() for p in opt.param_groups[0]["params"]]
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        scaler.unscale_(opt)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, opt.param_groups[0]["params"]))


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"growth_factor": 1.0}, "The growth factor must be > 1.0."),
        ({"growth_factor": 0.5, "backoff_factor": 2.0}, "The growth factor must be > 1.0."),
        ({"backoff_factor": 1.0}, "The backoff factor must be < 1.0."),
    ],
)
def test_bad_factors_raise_torchs_assertions(kwargs, text):
    with pytest.raises(AssertionError) as theirs:
        torch.amp.GradScaler("cpu", **kwargs)
    with pytest.raises(AssertionError) as ours:
        GradScaler(**kwargs)
    assert str(ours.value) == str(theirs.value) == text


@pytest.mark.parametrize("kwargs", [{"min_scale": -1.0}, {"max_scale": 0}, {"min_scale": 8.0, "max_scale": 4.0}])
def test_bad_bounds_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        GradScaler(**kwargs)


def test_update_on_the_optimizer_thread_is_refused():
    scaler, (model, opt) = GradScaler(), _setup()
    _backward(scaler, model)
    scaler.step(opt)
    with pytest.raises(RuntimeError) as refused:
        optim_stream.launch(scaler.update).wait()
    assert str(refused.value) == "GradScaler.update() must be called from the main thread."
    scaler.update()  # the main thread can still finish the iteration


def test_missing_inf_checks_in_a_lagged_iteration_reach_the_main_thread_once():
    scaler, (model, opt) = GradScaler(8.0), _setup()
    _backward(scaler, model)
    optim_stream.launch(lambda: None)  # a step function that forgot scaler.step()
    scaler.update()  # lagged: iteration 1's result is only applied at the next update
    optim_stream.synchronize()  # as RoundPipe's step() does before the next backward
    _backward(scaler, model)
    optim_stream.launch(lambda: (scaler.step(opt), opt.zero_grad()))
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update."):
        scaler.update()
    optim_stream.synchronize()
    _backward(scaler, model)
    optim_stream.launch(lambda: (scaler.step(opt), opt.zero_grad()))
    scaler.update()  # reported once; training goes on
    optim_stream.synchronize()
    assert scaler.get_scale() == 8.0


def test_pickling_mid_iteration_is_refused_like_torch():
    import pickle

    scaler, (model, opt) = GradScaler(), _setup()
    _backward(scaler, model)
    scaler.unscale_(opt)
    with pytest.raises(AssertionError) as ours:
        pickle.dumps(scaler)
    theirs_scaler, (m2, o2) = torch.amp.GradScaler("cpu"), _setup()
    _backward(theirs_scaler, m2)
    theirs_scaler.unscale_(o2)
    with pytest.raises(AssertionError) as theirs:
        pickle.dumps(theirs_scaler)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "pending",
    [5.0, "1", ["x"], [float("nan")], [float("inf")], [-1.0], [True], [1.0] * 200, [0.0, 1.0]],
    ids=["scalar", "string", "non-number", "nan", "inf", "negative", "bool", "long-list", "two"],
)
def test_a_bad_pending_result_is_refused_before_anything_is_loaded(pending):
    scaler, (model, opt) = GradScaler(8.0, growth_interval=1), _setup()
    _backward(scaler, model)
    scaler.step(opt)
    scaler.update()
    before = scaler.state_dict()
    bad = dict(before, scale=1024.0, growth_factor=3.0, _growth_tracker=7, _pending_found_inf=pending)
    with pytest.raises(ValueError, match="_pending_found_inf"):
        scaler.load_state_dict(bad)
    assert scaler.state_dict() == before
    opt.zero_grad()
    _backward(scaler, model)  # training goes on with the scale it had
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 32.0


@pytest.mark.parametrize("pending", [[], [0.0], [1], (2.0,)])
def test_a_valid_pending_result_is_applied_by_the_next_update(pending):
    scaler, (model, opt) = GradScaler(8.0, growth_interval=1), _setup()
    _backward(scaler, model)
    scaler.load_state_dict({"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                            "growth_interval": 1, "_growth_tracker": 0, "_pending_found_inf": pending})
    scaler.step(opt)
    scaler.update()  # applies the loaded result (if any), then this plain iteration's clean one
    expected = 64.0 * (0.5 if pending and pending[0] else (2.0 if pending else 1.0)) * 2.0
    assert scaler.get_scale() == expected
