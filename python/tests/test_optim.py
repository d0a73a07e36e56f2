"""kiln.optim: SGD and AdamW against float64 NumPy transcriptions of torch.optim's updates, param
groups whose lr a scheduler or the user changes, state_dict round trips, the LR schedulers against
their formulas (and torch's sequences where importable), nn.utils.clip_grad_norm_."""
import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.optim import lr_scheduler as S


def params_and_grads(n_steps, shapes=((4, 3), (5,))):
    params = [nn.Parameter(kiln.randn(*s, dtype=kiln.float64)) for s in shapes]
    grads = [[kiln.randn(*s, dtype=kiln.float64) * (0.1 if k % 2 else 2.0) for s in shapes] for k in range(n_steps)]
    return params, grads


def sgd_reference(p, grads, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, maximize=False):
    p, buf = p.copy(), None
    for g in grads:
        g = (-g if maximize else g) + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def adamw_reference(p, grads, lrs, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    p, m, v = p.copy(), 0.0, 0.0
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps)
    return p


@pytest.mark.parametrize("opts", [dict(), dict(momentum=0.9, dampening=0.2, wd=0.05),
                                  dict(momentum=0.8, nesterov=True, wd=0.01), dict(momentum=0.5, maximize=True)],
                         ids=["plain", "momentum", "nesterov", "maximize"])
def test_sgd_matches_torch_update(opts):
    params, grads = params_and_grads(5)
    start = [p.detach().numpy().copy() for p in params]
    kw = {("weight_decay" if k == "wd" else k): v for k, v in opts.items()}
    opt = kiln.optim.SGD(params, lr=0.1, **kw)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g
        opt.step()
    for i, p in enumerate(params):
        ref = sgd_reference(start[i], [step[i].numpy() for step in grads], 0.1, **opts)
        np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-12, atol=1e-12)


def test_adamw_groups_take_their_own_and_changed_learning_rates():
    params, grads = params_and_grads(4)
    start = [p.detach().numpy().copy() for p in params]
    opt = kiln.optim.AdamW([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.05, "weight_decay": 0.0}],
                           lr=0.01)
    assert opt.param_groups[1]["betas"] == (0.9, 0.999) and opt.param_groups[0]["weight_decay"] == 1e-2
    lrs0, lrs1 = [], []
    for k, step in enumerate(grads):
        opt.param_groups[0]["lr"] = 0.01 * (k + 1)  # as a scheduler does
        lrs0.append(0.01 * (k + 1))
        lrs1.append(0.05)
        for p, g in zip(params, step):
            p.grad = g
        opt.step()
    ref0 = adamw_reference(start[0], [s[0].numpy() for s in grads], lrs0)
    ref1 = adamw_reference(start[1], [s[1].numpy() for s in grads], lrs1, wd=0.0)
    np.testing.assert_allclose(params[0].detach().numpy(), ref0, rtol=1e-10)
    np.testing.assert_allclose(params[1].detach().numpy(), ref1, rtol=1e-10)
    assert opt.state[params[0]]["step"].item() == 4


@pytest.mark.parametrize("make", [lambda ps: kiln.optim.AdamW(ps, lr=0.01),
                                  lambda ps: kiln.optim.SGD(ps, lr=0.1, momentum=0.9)], ids=["AdamW", "SGD"])
def test_state_dict_round_trip_resumes_identically(make):
    params, grads = params_and_grads(6)
    opt = make(params)
    for step in grads[:3]:
        for p, g in zip(params, step):
            p.grad = g
        opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(twins)
    resumed.load_state_dict(sd)
    assert resumed.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    # string keys (a nested dict written to a flat file and read back) are accepted too
    resumed_str = make([nn.Parameter(p.detach().clone()) for p in params])
    resumed_str.load_state_dict({"state": {str(k): v for k, v in sd["state"].items()},
                                 "param_groups": sd["param_groups"]})
    for step in grads[3:]:
        for group in (params, twins, resumed_str.param_groups[0]["params"]):
            for p, g in zip(group, step):
                p.grad = g
        opt.step()
        resumed.step()
        resumed_str.step()
    for a, b, c in zip(params, twins, resumed_str.param_groups[0]["params"]):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
        np.testing.assert_array_equal(a.detach().numpy(), c.detach().numpy())
    with pytest.raises(ValueError, match="different number of parameter groups"):
        resumed.load_state_dict({"state": {}, "param_groups": []})


def test_optimizer_state_dict_saves_with_kiln_save_when_nested_dicts_are_supported(tmp_path):
    params, grads = params_and_grads(1)
    opt = kiln.optim.AdamW(params)
    for p, g in zip(params, grads[0]):
        p.grad = g
    opt.step()
    try:
        kiln.save(opt.state_dict(), tmp_path / "opt.pt")
    except (TypeError, kiln.KilnError) as e:
        pytest.skip(f"kiln.save has no nested dicts here: {e}")
    loaded = kiln.load(tmp_path / "opt.pt")
    resumed = kiln.optim.AdamW([nn.Parameter(p.detach().clone()) for p in params])
    resumed.load_state_dict(loaded)
    np.testing.assert_array_equal(resumed.state_dict()["state"][0]["exp_avg"].numpy(),
                                  opt.state_dict()["state"][0]["exp_avg"].numpy())


def test_add_param_group_keeps_state_and_zero_grad():
    a, b = nn.Parameter(kiln.randn(3)), nn.Parameter(kiln.randn(2))
    opt = kiln.optim.AdamW([a], lr=0.1)
    a.grad = kiln.ones(3)
    opt.step()
    m = opt.state[a]["exp_avg"].numpy().copy()
    opt.add_param_group({"params": b, "lr": 0.5})
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["eps"] == 1e-8
    np.testing.assert_array_equal(opt.state[a]["exp_avg"].numpy(), m)
    assert b not in opt.state
    with pytest.raises(ValueError, match="more than once"):
        opt.add_param_group({"params": [a]})
    b.grad = kiln.ones(2)
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_optimizer_argument_errors_use_torch_wording():
    p = nn.Parameter(kiln.randn(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        kiln.optim.SGD([])
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        kiln.optim.AdamW([p], lr=-1)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        kiln.optim.AdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        kiln.optim.SGD([p], nesterov=True)
    with pytest.raises(ValueError, match="non-leaf"):
        kiln.optim.SGD([p * 2])
    with pytest.raises(TypeError, match="iterable of Tensors"):
        kiln.optim.SGD(p)
    opt = kiln.optim.SGD([p], lr=0.1)
    opt.param_groups[0]["lr"] = -0.5
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.step()


def lr_sequence(make, steps=12, base=0.1):
    opt = kiln.optim.SGD([nn.Parameter(kiln.zeros(1))], lr=base)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]
    return out


SCHEDULES = {
    "lambda": (lambda o: S.LambdaLR(o, lambda s: 0.9 ** s), lambda s: 0.1 * 0.9 ** s),
    "linear": (lambda o: S.LinearLR(o, start_factor=0.25, total_iters=4),
               lambda s: 0.1 * (0.25 + 0.75 * min(s, 4) / 4)),
    "cosine": (lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
               lambda s: 0.01 + 0.09 * (1 + math.cos(math.pi * s / 10)) / 2),
    "warmup_cosine": (lambda o: S.WarmupCosineLR(o, warmup_steps=3, total_steps=10, min_lr=0.01),
                      lambda s: 0.1 * (s + 1) / 3 if s < 3 else
                      (0.01 + 0.045 * (1 + math.cos(math.pi * (s - 3) / 7)) if s < 10 else 0.01)),
    "sequential": (lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.5, total_iters=3), S.CosineAnnealingLR(o, 6)],
                                            milestones=[3]),
                   lambda s: 0.1 * (0.5 + 0.5 * s / 3) if s < 3 else 0.05 * (1 + math.cos(math.pi * (s - 3) / 6))),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedulers_follow_their_formulas(name):
    make, formula = SCHEDULES[name]
    np.testing.assert_allclose(lr_sequence(make), [formula(s) for s in range(12)], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["lambda", "linear", "cosine", "sequential"])
def test_schedulers_match_torch(name):
    torch = pytest.importorskip("torch")
    TS = torch.optim.lr_scheduler
    makers = {
        "lambda": lambda o: TS.LambdaLR(o, lambda s: 0.9 ** s),
        "linear": lambda o: TS.LinearLR(o, start_factor=0.25, total_iters=4),
        "cosine": lambda o: TS.CosineAnnealingLR(o, T_max=10, eta_min=0.01),
        "sequential": lambda o: TS.SequentialLR(o, [TS.LinearLR(o, 0.5, total_iters=3), TS.CosineAnnealingLR(o, 6)],
                                                milestones=[3]),
    }
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched, ref = makers[name](opt), []
    for _ in range(12):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(lr_sequence(SCHEDULES[name][0]), ref, rtol=1e-9)


def test_scheduler_state_dict_resumes():
    opt = kiln.optim.AdamW([nn.Parameter(kiln.zeros(1))], lr=0.1)
    sched = S.WarmupCosineLR(opt, 2, 10)
    for _ in range(4):
        sched.step()
    sd = sched.state_dict()
    opt2 = kiln.optim.AdamW([nn.Parameter(kiln.zeros(1))], lr=0.1)
    sched2 = S.WarmupCosineLR(opt2, 2, 10)
    sched2.load_state_dict(sd)
    sched.step()
    sched2.step()
    assert sched.get_last_lr() == sched2.get_last_lr()


def test_clip_grad_norm_scales_to_max_norm():
    params, grads = params_and_grads(1)
    for p, g in zip(params, grads[0]):
        p.grad = g
    gn = [g.numpy().copy() for g in grads[0]]
    total = math.sqrt(sum((g ** 2).sum() for g in gn))
    out = nn.utils.clip_grad_norm_(params, 0.5)
    assert abs(out.item() - total) < 1e-5 * total
    scale = 0.5 / (total + 1e-6)
    for p, g in zip(params, gn):
        np.testing.assert_allclose(p.grad.numpy(), g * scale, rtol=1e-12)
    assert nn.utils.clip_grad_norm_(params[0], 100.0).item() < total  # single tensor; no change below max
    with pytest.raises(ValueError, match="norm_type=2.0 only"):
        nn.utils.clip_grad_norm_(params, 1.0, norm_type=1)
    params[1].grad = kiln.full((5,), float("inf"), dtype=kiln.float64)
    before = params[0].grad.numpy().copy()
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(params[0].grad.numpy(), before)  # untouched
