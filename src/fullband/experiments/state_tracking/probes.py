"""The residual stream at every depth under a given prefill, and closed-form linear probes on it.

:func:`residual_stream` takes the prefill's last pass from the model's own loop: the inputs that pass builds from
the states before it (:meth:`~fullband.model.feedback.FeedbackLM.stack_inputs`), run through the network keeping
every depth (:meth:`~fullband.model.feedback.FeedbackLM.depth_states`). Depth 0 is the input layer: the token
embedding at a plain position, ``fuse(e_t, h_{t-1})`` at a fused one (after the native input norm); a retrofitted
model's depths are its pretrained network's ``hidden_states``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fullband.experiments.state_tracking.config import STATE_PREFILL_MODES
from fullband.model import FeedbackLM
from fullband.modes import prefill_of

# name -> passes: standard 1, one-step 2 (fused(1)), exact None (the full recurrence)
PREFILLS = {name: prefill_of(mode).passes for name, mode in STATE_PREFILL_MODES.items()}


@torch.no_grad()
def residual_stream(model: FeedbackLM, tokens: torch.Tensor, passes: int | None) -> torch.Tensor:
    """(L + 1, B, T, D): the input vectors and every block's output for the last pass of a prefill of ``tokens``
    (B, T) with ``passes`` passes (1 = standard, 2 = one recurrent step, None = exact), plain prefix 1."""
    B, T = tokens.shape
    carried = None  # the states the last pass fuses: those of the pass before it
    if model.fuse is not None and passes != 1:
        previous = model.forward_exact(tokens, plain_prefix=1) if passes is None else model(tokens, passes - 1)
        # The exact states are a fixed point: one more pass from them reproduces them.
        carried = previous.hidden
    positions = torch.arange(T, device=tokens.device).expand(B, T)
    return model.depth_states(tokens, model.stack_inputs(tokens, carried), positions)


def final_token_states(
    model: FeedbackLM, tokens: torch.Tensor, passes: int | None, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """(states (L + 1, N, D), next-token logits (N, V)) at the last position of every row, in batches."""
    states, logits = [], []
    for start in range(0, tokens.shape[0], batch_size):
        stream = residual_stream(model, tokens[start : start + batch_size], passes)[:, :, -1]  # (L+1, b, D)
        states.append(stream)
        with torch.no_grad():
            logits.append(model.logits_of_top(stream[-1]))
    return torch.cat(states, dim=1), torch.cat(logits)


@dataclass
class RidgeProbe:
    """A linear classifier on standardised features: ``argmax([(x - mean) / std, 1] @ weights)``."""

    weights: torch.Tensor  # (D + 1, C), float64
    mean: torch.Tensor  # (D,)
    std: torch.Tensor  # (D,)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return _with_bias((x.double() - self.mean) / self.std) @ self.weights

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float((self.scores(x).argmax(1) == y).double().mean())


def fit_ridge_probe(x: torch.Tensor, y: torch.Tensor, num_classes: int, ridge: float = 1e-2) -> RidgeProbe:
    """Closed-form ridge regression of one-hot targets on standardised features ``x`` (N, D), in float64.

    ``ridge`` is relative to the number of examples, so it means the same for any N; the bias is not penalised.
    """
    x = x.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
    features = _with_bias((x - mean) / std)  # (N, D + 1)
    targets = torch.nn.functional.one_hot(y, num_classes).double()  # (N, C)
    penalty = torch.full((features.shape[1],), ridge * len(x), dtype=x.dtype)
    penalty[-1] = 0.0
    weights = torch.linalg.solve(features.T @ features + torch.diag(penalty), features.T @ targets)
    return RidgeProbe(weights, mean, std)


def probe_accuracy(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, num_classes: int,
    ridge: float = 1e-2,
) -> float:
    """Held-out accuracy of a ridge probe fit on (train_x (N, D), train_y (N,))."""
    return fit_ridge_probe(train_x, train_y, num_classes, ridge).accuracy(test_x, test_y)


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((x, torch.ones(len(x), 1, dtype=x.dtype, device=x.device)), dim=1)
