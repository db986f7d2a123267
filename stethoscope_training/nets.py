"""The two networks in torch (training only: this module imports torch; inference runs their ONNX
export). Graph inputs and outputs are named as docs/design.md "Learned diagnosis" and the
metadata's `graphs` say."""

from __future__ import annotations

import torch
from torch import nn

# The detector compares the recent part of the window: a finding is about now, and a fault that
# began late in the window would be diluted by the healthy steps before it.
RECENT_STEPS = 36  # 3 minutes at 5 s
# The classifier also sees each feature's change since the window's first minute. Fresh sets kept
# finding healthy work whose pattern (alternating collectives, a swinging load) runs through the
# whole window read as a fault that begins in it: a fault changes something, a workload is itself.
BASELINE_STEPS = 12  # 1 minute at 5 s


class Classifier(nn.Module):
    """GRU over the normalised features, their mask channels and their change since the window's
    first minute (that minute's observed mean; 0 where it saw none). Its last hidden state, the
    mean and the maximum of its hidden states over the window (an intermittent fault shows in the
    maximum, a steady one in the mean) and each feature's own peak go through `head1` and `head2`
    (what finetune trains) to a softmax."""

    def __init__(
        self, features: int = 12, hidden: int = 32, head: int = 32, classes: int = 4, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.gru = nn.GRU(3 * features, hidden, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.head1 = nn.Linear(3 * hidden + features, head)
        self.head2 = nn.Linear(head, classes)

    def embed(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen = x * mask
        count = mask[:, :BASELINE_STEPS].sum(dim=1, keepdim=True)
        baseline = seen[:, :BASELINE_STEPS].sum(dim=1, keepdim=True) / torch.clamp(count, min=1.0)
        change = (seen - baseline) * mask * (count > 0).float()
        out, last = self.gru(torch.cat([seen, mask, change], dim=2))
        peak = (seen - 1e4 * (1 - mask)).amax(dim=1) * (mask.amax(dim=1))
        return torch.cat([last[0], out.mean(dim=1), out.amax(dim=1), peak], dim=1)

    def logits_of(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.head2(self.drop(torch.relu(self.head1(self.drop(embedding)))))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits_of(self.embed(x, mask)), dim=1)


class Detector(nn.Module):
    """Fleet-relative distance with fixed weights (nothing to learn, so nothing to overfit to the
    generator): per feature, the mean absolute gap between the node's normalised window and its
    peers' median over the recent steps both observed, less a noise margin; the score is their sum.
    Only the threshold on the score is chosen, on validation episodes. Features whose weight in
    `counted` is 0 (the error counters, metadata.ERROR_COUNTERS) add nothing: a node counting a
    trickle of correctable errors its peers do not is common and harmless, and the rules and the
    classifier judge counters on their own; counted, such healthy nodes set the threshold so high
    that a rank whose port waits were 1000 times its lockstep peers' did not reach it."""

    def __init__(self, counted: list[float], margin: float = 0.25, recent: int = RECENT_STEPS) -> None:
        super().__init__()
        self.margin = margin
        self.recent = recent
        self.counted: torch.Tensor
        self.register_buffer("counted", torch.tensor(counted))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor, peer_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        both = (mask * peer_mask)[:, -self.recent :, :]
        gap = torch.abs(x - peer)[:, -self.recent :, :] * both
        deviation = torch.relu(gap.sum(dim=1) / (both.sum(dim=1) + 1.0) - self.margin) * self.counted
        return deviation.sum(dim=1), deviation
