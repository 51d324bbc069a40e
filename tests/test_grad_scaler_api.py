"""The rest of the drop-in surface: construction, scale() shapes, getters/setters,
checkpoints in both directions, pickling, disabled scalers, torch's private surface."""

import copy
import inspect
import pickle

import pytest
import torch

from roundpipe import GradScaler, OptState, optim_stream
from scaler_loops import batches, inject, make_model, reference_scales


def test_signature_matches_upstream_roundpipe_and_adds_keyword_only_extras():
    params = list(inspect.signature(GradScaler.__init__).parameters.values())[1:]
    upstream = [
        ("init_scale", 65536.0),
        ("growth_factor", 2.0),
        ("backoff_factor", 0.5),
        ("growth_interval", 2000),
        ("enabled", True),
    ]
    assert [(p.name, p.default) for p in params[:5]] == upstream
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:5])
    assert all(p.kind is p.KEYWORD_ONLY for p in params[5:])
    update = inspect.signature(GradScaler.update).parameters
    assert list(update)[1:] == ["new_scale", "is_async"]
    assert update["is_async"].default is True
    for getter in ("get_growth_factor", "get_backoff_factor", "get_growth_interval"):
        assert inspect.signature(getattr(GradScaler, getter)).parameters["up_to_date"].default is False


def test_leading_device_argument_is_accepted_like_torch():
    scaler = GradScaler("cpu", 128.0, 3.0, 0.25, 7)
    assert (
        scaler.get_scale(),
        scaler.get_growth_factor(),
        scaler.get_backoff_factor(),
        scaler.get_growth_interval(),
    ) == (128.0, 3.0, 0.25, 7)
    assert GradScaler(device="cpu", init_scale=4.0).get_scale() == 4.0
    mixed = GradScaler("cpu", 1024.0, growth_interval=2, backoff_factor=0.125)
    assert (mixed.get_scale(), mixed.get_growth_factor(), mixed.get_backoff_factor(), mixed.get_growth_interval()) == (
        1024.0,
        2.0,
        0.125,
        2,
    )
    assert GradScaler(torch.device("cpu"), 8.0, 3.0, 0.5, 4, False).is_enabled() is False
    with pytest.raises(TypeError):
        GradScaler("cpu", device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_cuda_device_without_cuda_disables_with_a_warning_like_torch():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = GradScaler("cuda")
    assert not scaler.is_enabled()


def test_scale_handles_nested_containers_like_torch():
    ours, theirs = GradScaler(8.0), torch.amp.GradScaler("cpu", 8.0)
    value = [torch.ones(2), (torch.full((), 2.0), [torch.ones(1, dtype=torch.float64)])]
    a, b = ours.scale(value), theirs.scale(value)
    assert type(a) is list and type(a[1]) is tuple
    assert torch.equal(a[0], b[0]) and torch.equal(a[1][0], b[1][0])
    assert a[1][1][0].dtype == torch.float64 and torch.equal(a[1][1][0], b[1][1][0])
    lazy = ours.scale(iter([torch.ones(1)]))
    assert torch.equal(next(iter(lazy)), torch.full((1,), 8.0))
    assert ours.scale(torch.tensor(3)).dtype == theirs.scale(torch.tensor(3)).dtype == torch.float32
    assert ours.scale(torch.ones(1, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_scale_of_empty_list_does_not_create_the_scale():
    scaler = GradScaler()
    assert scaler.scale([]) == []
    assert scaler._scale is None and scaler._get_scale_async() is None


def test_disabled_scaler_is_a_pass_through():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(enabled=False)
    loss = model(torch.randn(2, 6)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    calls = []
    assert scaler.step(opt, closure=lambda: calls.append(1) or 0.0) == 0.0
    assert calls == [1] and not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    scaler.unscale_(opt)
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {} and not scaler.is_enabled()
    scaler.load_state_dict({})
    assert pickle.loads(pickle.dumps(scaler)).is_enabled() is False


def test_get_scale_before_first_scale_returns_init_scale_as_given():
    assert GradScaler(1024).get_scale() == 1024
    assert isinstance(GradScaler(1024).get_scale(), int)


def test_setters_apply_at_once_from_the_main_thread():
    scaler = GradScaler()
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(5)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.25, 5)


def test_setters_on_the_optimizer_thread_apply_in_fifo_order():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(2.0, growth_interval=1)
    ((x, y),) = batches(1)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()

    def step_fn():
        scaler.step(opt)
        scaler.set_growth_factor(4.0)
        assert scaler.get_growth_factor() == 4.0  # the optimizer thread sees its own change

    optim_stream.launch(step_fn)
    assert scaler.get_growth_factor(up_to_date=True) == 4.0
    scaler.update()
    assert scaler.get_scale() == 8.0  # grown by the new factor, as torch would


def test_update_with_new_scale_accepts_int_float_and_tensor_and_copies():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(2.0)
    for new in (7, 3.5, torch.tensor([12.0]), torch.tensor(5.0, dtype=torch.float64)):
        ((x, y),) = batches(1)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        opt.zero_grad()
        scaler.update(new)
        assert scaler.get_scale() == float(new if not isinstance(new, torch.Tensor) else new.item())
        if isinstance(new, torch.Tensor):
            new.fill_(99.0)
            assert scaler.get_scale() != 99.0


def test_update_with_new_scale_takes_effect_next_iteration_even_when_lagged():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(16.0, growth_interval=1)
    seen = []
    for k, (x, y) in enumerate(batches(4)):
        seen.append(scaler.get_scale())
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        job = optim_stream.launch(lambda: (scaler.step(opt), opt.zero_grad()))
        scaler.update(3.0 if k == 1 else None)
        job.wait()
    # update 2 applies iteration 1's growth (16 -> 32), then the override; iteration 2's
    # result is discarded, as torch discards the result of an update(new_scale) iteration.
    assert seen == [16.0, 16.0, 3.0, 3.0]


def _run_with(scaler, model, opt, data, pattern, mode="plain"):
    scales = []
    for (x, y), fault in zip(data, pattern):
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        inject(model, fault)

        def step_fn():
            return scaler.step(opt), opt.zero_grad()

        if mode == "plain":
            step_fn()
        else:
            optim_stream.launch(step_fn)
        scaler.update()
        if mode == "async":
            optim_stream.synchronize()
        scales.append(scaler.get_scale())
    return scales


@pytest.mark.parametrize(
    "source, target",
    [
        (lambda: torch.amp.GradScaler("cpu", 64.0, growth_interval=2), lambda: GradScaler(1.0)),
        (lambda: GradScaler(64.0, growth_interval=2), lambda: torch.amp.GradScaler("cpu", 1.0)),
        (lambda: GradScaler(64.0, growth_interval=2), lambda: GradScaler(1.0)),
    ],
)
def test_state_dict_round_trips_between_torch_and_roundpipe(source, target):
    pattern = [0, "inf", 0, 0, 0, "nan", 0, 0, 0, 0]
    data = batches(len(pattern))
    model, first = make_model(), source()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    head = _run_with(first, model, opt, data[:5], pattern[:5])
    saved = first.state_dict()
    assert list(saved)[:5] == ["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"]
    resumed = target()
    resumed.load_state_dict(saved)
    tail = _run_with(resumed, model, opt, data[5:], pattern[5:])
    assert head + tail == reference_scales(64.0, [bool(f) for f in pattern], interval=2)


def test_lagged_state_dict_resumes_the_same_sequence():
    pattern = [0, "inf", 0, 0, 0, "nan", 0, 0, 0, 0]
    data = batches(len(pattern))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = GradScaler(64.0, growth_interval=2)
    head = _run_with(first, model, opt, data[:5], pattern[:5], mode="async")
    saved = first.state_dict()
    assert saved["_pending_found_inf"] == [0.0]  # iteration 5's result is not applied yet
    resumed = GradScaler()
    resumed.load_state_dict(saved)
    tail = _run_with(resumed, model, opt, data[5:], pattern[5:], mode="async")
    assert head + tail == reference_scales(64.0, [bool(f) for f in pattern], interval=2, lag=1)


@pytest.mark.parametrize("clone", [pickle.loads, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_pickle_and_deepcopy_between_iterations(clone):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = GradScaler(32.0, growth_interval=1)
    _run_with(scaler, model, opt, batches(2), [0, 0])
    payload = pickle.dumps(scaler) if clone is pickle.loads else scaler
    twin = clone(payload)
    assert twin.state_dict() == scaler.state_dict()
    assert twin.get_scale() == 128.0 and twin._scale is None  # lazily re-created


def test_private_found_inf_tensors_are_the_ones_step_reads():
    """Users all-reduce found_inf in place between unscale_ and step; step must see it."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = GradScaler(8.0)
    ((x, y),) = batches(1)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    scaler.unscale_(opt)
    state = scaler._per_optimizer_states[id(opt)]
    assert state["stage"] is OptState.UNSCALED
    for found_inf in scaler._found_inf_per_device(opt).values():
        found_inf.fill_(1.0)  # as if another rank overflowed
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    scaler.update()
    assert scaler.get_scale() == 4.0


def test_sparse_and_bf16_grads_are_unscaled_like_torch():
    def run(scaler):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        lin = torch.nn.Linear(3, 1).to(torch.bfloat16)
        opt = torch.optim.SGD(list(emb.parameters()) + list(lin.parameters()), lr=0.1)
        out = lin(emb(torch.tensor([1, 2, 1])).to(torch.bfloat16)).float().sum()
        scaler.scale(out).backward()
        scaler.unscale_(opt)
        grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in opt.param_groups[0]["params"]]
        scaler.step(opt)
        scaler.update()
        return grads, [p.detach().clone() for p in opt.param_groups[0]["params"]]

    ours, theirs = run(GradScaler(16.0)), run(torch.amp.GradScaler("cpu", 16.0))
    for a, b in zip(ours[0] + ours[1], theirs[0] + theirs[1]):
        assert torch.equal(a, b)


def test_legacy_grad_scaler_keyword_contract_warns_and_passes_the_scaler():
    class Legacy(torch.optim.SGD):
        _step_supports_amp_scaling = True

        def step(self, closure=None, grad_scaler=None):
            grad_scaler.unscale_(self)
            self.seen = grad_scaler
            return super().step()

    model = make_model()
    opt = Legacy(model.parameters(), lr=0.1)
    scaler = GradScaler(4.0)
    ((x, y),) = batches(1)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    with pytest.warns(FutureWarning, match="stop passing itself"):
        optim_stream.launch(scaler.step, opt).wait()
    assert opt.seen is scaler
    scaler.update()
