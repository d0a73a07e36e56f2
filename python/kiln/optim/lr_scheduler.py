"""kiln.optim.lr_scheduler: torch.optim.lr_scheduler's protocol (call step() after optimizer.step();
each step sets every param group's "lr"). Rates come from closed forms of (base lr, step count),
so they never drift with the number of steps."""
import bisect
import math

from .. import _C

__all__ = ["LRScheduler", "LambdaLR", "LinearLR", "CosineAnnealingLR", "SequentialLR", "WarmupCosineLR",
           "warmup_cosine_lr"]


def warmup_cosine_lr(step, warmup_steps, total_steps, max_lr, min_lr=0.0):
    """The rate at optimizer step `step` (0-based): max_lr * (step + 1) / warmup_steps during the
    warm-up, then a cosine from max_lr down to min_lr at total_steps, min_lr after (kiln::optim's
    formula, the one `kiln train` uses)."""
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps, got {warmup_steps} and {total_steps}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return _C._optim.warmup_cosine_lr(step, warmup_steps, total_steps, max_lr, min_lr)


class LRScheduler:
    """Base class: subclasses define get_lr() from self.base_lrs and self.last_epoch (the number
    of step() calls so far; the constructor makes the first call, setting step 0's rate)."""

    def __init__(self, optimizer, last_epoch=-1):
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming an optimizer")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def get_lr(self):
        raise NotImplementedError

    def get_last_lr(self):
        """The rates the last step() set, one per param group."""
        return self._last_lr

    def step(self, epoch=None):
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        """Everything but the optimizer (and functions, which cannot be saved)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)
                and not (isinstance(v, list) and any(callable(x) for x in v))}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step); lr_lambda: one function or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]


class LinearLR(LRScheduler):
    """lr = base_lr * factor, the factor going linearly from start_factor to end_factor over
    total_iters steps, then staying at end_factor."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1, "
                             "ending factor between 0 and 1.")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t = min(self.last_epoch, self.total_iters)
        factor = self.start_factor + (self.end_factor - self.start_factor) * t / max(self.total_iters, 1)
        return [base * factor for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2 (SGDR without restarts;
    past T_max the cosine keeps going, as PyTorch's)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        if T_max <= 0:
            raise ValueError(f"T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        c = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


class WarmupCosineLR(LRScheduler):
    """Linear warm-up then cosine decay: lr = warmup_cosine_lr(step, warmup_steps, total_steps,
    base_lr, min_lr) per group (kiln::optim's formula: step 0 already trains at base_lr /
    warmup_steps; min_lr from total_steps on)."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0, last_epoch=-1):
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"need 0 <= warmup_steps <= total_steps, got {warmup_steps} and {total_steps}")
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [warmup_cosine_lr(self.last_epoch, self.warmup_steps, self.total_steps, base, self.min_lr)
                for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Runs schedulers[0] until milestones[0], then schedulers[1] (restarted at its step 0), ...;
    e.g. SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=100), CosineAnnealingLR(opt, 900)],
    milestones=[100])."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler")
        for i, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(f"Sequential Schedulers expects all schedulers to belong to the same optimizer, "
                                 f"but got scheduler at index {i} to be different than the optimizer passed in.")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        self.optimizer = optimizer
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._schedulers[0].step(0)
        self._last_lr = self._schedulers[0].get_last_lr()

    def step(self, epoch=None):
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "_milestones": self._milestones,
                "_schedulers": [s.state_dict() for s in self._schedulers]}

    def load_state_dict(self, state_dict):
        self.last_epoch, self._milestones = state_dict["last_epoch"], state_dict["_milestones"]
        for s, sd in zip(self._schedulers, state_dict["_schedulers"]):
            s.load_state_dict(sd)
