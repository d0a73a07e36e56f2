"""kiln.optim: AdamW and SGD over kiln's C++ optimizers, and LR schedulers (torch.optim names).

    opt = kiln.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = kiln.optim.lr_scheduler.WarmupCosineLR(opt, warmup_steps=100, total_steps=1000)
    for x, y in batches:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        kiln.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
"""
from . import lr_scheduler
from .adamw import AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "AdamW", "SGD", "lr_scheduler"]
