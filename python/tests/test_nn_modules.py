"""kiln.nn.Module's protocol (registration, names, state_dict / load_state_dict with kiln.save /
kiln.load, train / eval, to, zero_grad, repr), the layers against NumPy float64 references, the
containers, nn.init's distributions and F.layer_norm / F.mse_loss."""
import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from conftest import TOL, rel_error, requires_cuda


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.register_buffer("scale", kiln.full((1,), 2.0))
        self.register_buffer("cache", kiln.zeros(2), persistent=False)

    def forward(self, x):
        return self.proj(self.norm(x)) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(4), Block(4)])
        self.head = nn.Linear(4, 10)
        self.drop = nn.Dropout(0.5)

    def forward(self, idx):  # [N] -> [N, 10]
        h = self.embed(idx)
        for b in self.blocks:
            h = b(h)
        return self.head(self.drop(h))


def test_named_parameters_buffers_modules_in_registration_order():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "embed.weight", "blocks.0.norm.weight", "blocks.0.proj.weight", "blocks.1.norm.weight",
        "blocks.1.proj.weight", "head.weight", "head.bias"]
    assert [n for n, _ in net.named_buffers()] == ["blocks.0.scale", "blocks.0.cache", "blocks.1.scale",
                                                    "blocks.1.cache"]
    assert [n for n, _ in net.named_modules()] == ["", "embed", "blocks", "blocks.0", "blocks.0.norm",
                                                    "blocks.0.proj", "blocks.1", "blocks.1.norm", "blocks.1.proj",
                                                    "head", "drop"]
    assert [n for n, _ in net.named_children()] == ["embed", "blocks", "head", "drop"]
    assert list(net.parameters(recurse=False)) == []
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in net.parameters())
    assert net.get_submodule("blocks.1.proj") is net.blocks[1].proj
    assert net.get_parameter("head.bias") is net.head.bias
    assert sum(p.numel() for p in net.parameters()) == 40 + 2 * (4 + 16) + 40 + 10


def test_registration_by_attribute_and_its_errors():
    m = nn.Module()
    m.w = nn.Parameter(kiln.randn(3))
    m.plain = kiln.randn(3)  # a plain tensor is an attribute, not a parameter
    m.child = nn.Linear(3, 2)
    assert [n for n, _ in m.named_parameters()] == ["w", "child.weight", "child.bias"]
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'w'"):
        m.w = kiln.randn(3)
    with pytest.raises(TypeError, match="child module 'child'"):
        m.child = 3
    m.w = None
    assert [n for n, _ in m.named_parameters()] == ["child.weight", "child.bias"]
    del m.child
    assert list(m.parameters()) == []
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'nothing'"):
        m.nothing
    with pytest.raises(KeyError, match='contain "."'):
        m.register_parameter("a.b", None)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("plain", kiln.zeros(1))
    with pytest.raises(NotImplementedError, match="missing the required \"forward\""):
        m(kiln.zeros(1))

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(kiln.zeros(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_shared_parameter_is_listed_once_and_gets_both_gradients():
    emb = nn.Embedding(6, 3)
    head = nn.Linear(3, 6, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    assert [n for n, _ in model.named_parameters()] == ["0.weight"]
    assert list(model.state_dict()) == ["0.weight", "1.weight"]  # state_dict keeps both names, as torch
    idx = kiln.tensor([1, 4])
    model(idx).sum().backward()
    w = emb.weight.detach().numpy().astype(np.float64)
    # loss = sum_i,v W[idx_i] . W[v]: the head gives every row sum_i W[idx_i], the lookup gives the
    # looked-up rows sum_v W[v].
    ref = np.tile(w[[1, 4]].sum(0), (6, 1))
    ref[1] += w.sum(0)
    ref[4] += w.sum(0)
    assert rel_error(emb.weight.grad.numpy(), ref) < 1e-6


def test_state_dict_round_trip_through_kiln_save(tmp_path):
    kiln.manual_seed(1)
    net = Net()
    sd = net.state_dict()
    assert "blocks.0.scale" in sd and "blocks.0.cache" not in sd  # non-persistent buffers stay out
    assert all(not v.requires_grad for v in sd.values())
    kiln.save(sd, tmp_path / "net.safetensors")
    kiln.manual_seed(2)
    other = Net()
    assert not np.array_equal(other.head.weight.detach().numpy(), net.head.weight.detach().numpy())
    weight_before = other.head.weight
    result = other.load_state_dict(kiln.load(tmp_path / "net.safetensors"))
    assert result.missing_keys == [] and result.unexpected_keys == [] and repr(result) == "<All keys matched successfully>"
    assert other.head.weight is weight_before  # copied in place: an optimizer's references stay valid
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(other.state_dict()[k].numpy(), v.numpy())


def test_load_state_dict_reports_missing_unexpected_and_size_mismatch():
    lin = nn.Linear(3, 2)
    sd = {"weight": kiln.zeros(2, 3), "extra": kiln.zeros(1)}
    with pytest.raises(RuntimeError) as e:
        lin.load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("Error(s) in loading state_dict for Linear:")
    assert 'Unexpected key(s) in state_dict: "extra".' in msg and 'Missing key(s) in state_dict: "bias".' in msg
    missing, unexpected = lin.load_state_dict(sd, strict=False)
    assert (missing, unexpected) == (["bias"], ["extra"])
    np.testing.assert_array_equal(lin.weight.detach().numpy(), np.zeros((2, 3)))
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: copying a param with shape \(3, 3\)"):
        lin.load_state_dict({"weight": kiln.zeros(3, 3)}, strict=False)
    new = kiln.ones(2)
    lin.load_state_dict({"weight": kiln.ones(2, 3), "bias": new}, assign=True)
    assert isinstance(lin.bias, nn.Parameter) and lin.bias.requires_grad


def test_train_eval_dropout_and_zero_grad_and_requires_grad():
    net = Net()
    assert net.training and net.drop.training
    assert net.eval() is net and not net.blocks[0].norm.training
    x = kiln.ones(64, 4)
    np.testing.assert_array_equal(net.drop(x).numpy(), x.numpy())  # identity in eval mode
    net.train()
    dropped = net.drop(x).numpy()
    assert set(np.unique(dropped)) <= {0.0, 2.0} and 0 < (dropped == 0).sum() < x.numel()
    with pytest.raises(ValueError, match="boolean"):
        net.train(1)
    net(kiln.tensor([1, 2])).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_to_moves_parameters_in_place_and_casts_floating_buffers():
    net = Net()
    params = list(net.parameters())
    opt = kiln.optim.SGD(net.parameters(), lr=0.1)
    before = net.head.weight.detach().numpy().astype(np.float64)
    assert net.to(kiln.float64) is net
    assert all(p.dtype == kiln.float64 for p in net.parameters())
    assert all(a is b for a, b in zip(params, net.parameters()))  # same Parameter objects
    assert net.blocks[0].scale.dtype == kiln.float64
    np.testing.assert_array_equal(net.head.weight.detach().numpy(), before)
    net(kiln.tensor([3])).sum().backward()
    opt.step()  # the optimizer built before the move updates the moved parameters
    assert not np.array_equal(net.head.weight.detach().numpy(), before)
    net.float()
    assert net.head.weight.dtype == kiln.float32 and net.head.weight.grad.dtype == kiln.float32
    with pytest.raises(TypeError, match="floating point"):
        net.to(kiln.int64)


def test_repr_is_torch_style():
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3, bias=False))
    assert repr(model) == ("Sequential(\n"
                           "  (0): Linear(in_features=2, out_features=8, bias=True)\n"
                           "  (1): ReLU()\n"
                           "  (2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
                           "  (3): Linear(in_features=8, out_features=3, bias=False)\n"
                           ")")
    assert repr(nn.Parameter(kiln.zeros(1))).startswith("Parameter containing:\ntensor(")


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=lambda d: d.name)
def test_layers_against_float64_references(dtype):
    x = kiln.randn(5, 6, dtype=dtype)
    xn = x.double().numpy()
    lin = nn.Linear(6, 3, dtype=dtype)
    w, b = lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()
    assert np.abs(w).max() <= 1 / math.sqrt(6) and lin.weight.dtype == dtype
    assert rel_error(lin(x).detach().double().numpy(), xn @ w.T + b) < TOL[dtype.name]
    norm = nn.RMSNorm(6, eps=1e-5, dtype=dtype)
    assert rel_error(norm(x).detach().double().numpy(), xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-5)) < TOL[dtype.name]
    ln = nn.LayerNorm(6, dtype=dtype)
    nn.init.normal_(ln.weight)
    nn.init.normal_(ln.bias)
    mu, var = xn.mean(-1, keepdims=True), xn.var(-1, keepdims=True)
    ref = (xn - mu) / np.sqrt(var + 1e-5) * ln.weight.detach().double().numpy() + ln.bias.detach().double().numpy()
    assert rel_error(ln(x).detach().double().numpy(), ref) < TOL[dtype.name]
    emb = nn.Embedding(7, 3, dtype=dtype)
    idx = kiln.tensor([[0, 6], [3, 3]])
    np.testing.assert_array_equal(emb(idx).detach().numpy(), emb.weight.detach().numpy()[idx.numpy()])


def test_layer_norm_gradient_and_bf16_and_shape_error():
    x = kiln.randn(4, 2, 8, dtype=kiln.float64, requires_grad=True)
    F.layer_norm(x, (2, 8)).sum().backward()  # rows sum to zero after normalisation: gradient ~ 0
    assert np.abs(x.grad.numpy()).max() < 1e-10
    xb = kiln.randn(3, 16).bfloat16()
    ref = F.layer_norm(xb.double(), 16).numpy()
    assert F.layer_norm(xb, 16).dtype == kiln.bfloat16
    assert rel_error(F.layer_norm(xb, 16).double().numpy(), ref) < TOL["bfloat16"]
    with pytest.raises(RuntimeError, match=r"Given normalized_shape=\[4\]"):
        F.layer_norm(x, 4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    a = kiln.randn(4, 5, dtype=kiln.float64, requires_grad=True)
    b = kiln.randn(4, 5, dtype=kiln.float64)
    d = (a.detach().numpy() - b.numpy()) ** 2
    ref = {"mean": d.mean(), "sum": d.sum(), "none": d}[reduction]
    out = F.mse_loss(a, b, reduction=reduction)
    assert rel_error(out.detach().numpy(), ref) < 1e-12
    assert rel_error(nn.MSELoss(reduction=reduction)(a, b).detach().numpy(), ref) < 1e-12
    F.mse_loss(a, b).backward()
    assert rel_error(a.grad.numpy(), 2 * (a.detach().numpy() - b.numpy()) / d.size) < 1e-12
    with pytest.raises(ValueError, match="not a valid value"):
        F.mse_loss(a, b, reduction="avg")


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    seq.append(nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and isinstance(seq[:2], nn.Sequential)
    assert seq(kiln.randn(5, 2)).shape == (5, 1)
    with pytest.raises(IndexError):
        seq[3]
    ml = nn.ModuleList([nn.Linear(1, 1)])
    ml += [nn.Linear(1, 2)]
    ml.insert(0, nn.Identity())
    assert [type(m).__name__ for m in ml] == ["Identity", "Linear", "Linear"]
    assert [n for n, _ in ml.named_parameters()] == ["1.weight", "1.bias", "2.weight", "2.bias"]
    md = nn.ModuleDict({"a": nn.Linear(1, 1), "b": nn.ReLU()})
    assert list(md.keys()) == ["a", "b"] and "a" in md and len(md) == 2
    assert [n for n, _ in md.named_parameters()] == ["a.weight", "a.bias"]


def test_linear_cross_entropy_loss_is_a_module():
    loss_fn = nn.LinearCrossEntropyLoss(8, 20, bias=True)
    assert [n for n, _ in loss_fn.named_parameters()] == ["weight", "bias"]
    assert list(loss_fn.state_dict()) == ["weight", "bias"]
    x, t = kiln.randn(6, 8), kiln.randint(0, 20, (6,))
    ref = F.cross_entropy(x @ loss_fn.weight.T + loss_fn.bias, t)
    assert rel_error(loss_fn(x, t).item(), ref.item()) < 1e-5
    emb = nn.Embedding(20, 8)
    tied = nn.LinearCrossEntropyLoss.tied(emb.weight)
    model = nn.ModuleDict({"emb": emb, "loss": tied})
    assert [n for n, _ in model.named_parameters()] == ["emb.weight"]
    tied(emb(kiln.tensor([1, 2])), kiln.tensor([3, 4])).backward()
    assert emb.weight.grad is not None


def test_init_functions_follow_their_distributions():
    w = kiln.empty(256, 512)
    nn.init.uniform_(w, -0.5, 0.25)
    a = w.numpy()
    assert a.min() >= -0.5 and a.max() < 0.25 and abs(a.mean() + 0.125) < 0.01
    nn.init.normal_(w, 1.0, 0.5)
    assert abs(w.numpy().mean() - 1.0) < 0.01 and abs(w.numpy().std() - 0.5) < 0.01
    nn.init.trunc_normal_(w, std=0.02, a=-0.03, b=0.03)
    assert np.abs(w.numpy()).max() <= 0.03 and 0.012 < w.numpy().std() < 0.02
    nn.init.xavier_uniform_(w)
    bound = math.sqrt(6 / (256 + 512))
    assert np.abs(w.numpy()).max() <= bound and abs(w.numpy().std() - bound / math.sqrt(3)) < 0.002
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's: bound 1/sqrt(fan_in)
    assert np.abs(w.numpy()).max() <= 1 / math.sqrt(512)
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(w.numpy().std() - math.sqrt(2 / 512)) < 0.002
    p = nn.Parameter(kiln.empty(3, 3, dtype=kiln.bfloat16))
    assert nn.init.zeros_(p) is p and np.all(p.detach().float().numpy() == 0) and p.requires_grad
    nn.init.ones_(p)
    assert np.all(p.detach().float().numpy() == 1)
    assert nn.init.calculate_gain("tanh") == 5.0 / 3
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        nn.init.xavier_uniform_(kiln.empty(3))


def test_deepcopy_gives_independent_parameters():
    import copy

    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    twin = copy.deepcopy(model)
    assert twin[0].weight is not model[0].weight and twin[0].weight.requires_grad
    np.testing.assert_array_equal(twin[0].weight.detach().numpy(), model[0].weight.detach().numpy())
    nn.init.zeros_(twin[0].weight)
    assert np.abs(model[0].weight.detach().numpy()).max() > 0


@requires_cuda
def test_module_to_cuda_trains_like_cpu():
    kiln.manual_seed(3)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    gpu = copy_of(cpu).to("cuda")
    assert all(p.is_cuda for p in gpu.parameters())
    x, y = kiln.randn(32, 8), kiln.randint(0, 4, (32,))
    for model, xs, ys in ((cpu, x, y), (gpu, x.cuda(), y.cuda())):
        opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            loss = F.cross_entropy(model(xs), ys)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    for a, b in zip(cpu.parameters(), gpu.parameters()):
        assert rel_error(b.detach().cpu().numpy(), a.detach().numpy()) < 1e-5


def copy_of(model):
    import copy

    return copy.deepcopy(model)
