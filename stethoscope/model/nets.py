"""The two networks in torch (training only: this module imports torch; inference runs their ONNX
export). Graph inputs and outputs are named as docs/design.md "Learned diagnosis" and the
metadata's `graphs` say."""

from __future__ import annotations

import torch
from torch import nn

# The detector compares the recent part of the window: a finding is about now, and a fault that
# began late in the window would be diluted by the healthy steps before it.
RECENT_STEPS = 36  # 3 minutes at 5 s


class Classifier(nn.Module):
    """GRU over the normalised features and their mask channels; the last hidden state and the mean
    of all hidden states go through `head1` and `head2` (what finetune trains) to a softmax."""

    def __init__(self, features: int = 12, hidden: int = 32, head: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.gru = nn.GRU(2 * features, hidden, batch_first=True)
        self.head1 = nn.Linear(2 * hidden, head)
        self.head2 = nn.Linear(head, classes)

    def embed(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out, last = self.gru(torch.cat([x * mask, mask], dim=2))
        return torch.cat([last[0], out.mean(dim=1)], dim=1)

    def logits_of(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.head2(torch.relu(self.head1(embedding)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits_of(self.embed(x, mask)), dim=1)


class Detector(nn.Module):
    """Fleet-relative distance with fixed weights (nothing to learn, so nothing to overfit to the
    generator): per feature, the mean absolute gap between the node's normalised window and its
    peers' median over the recent steps both observed, less a noise margin; the score is their sum.
    Only the threshold on the score is chosen, on validation episodes."""

    def __init__(self, margin: float = 0.25, recent: int = RECENT_STEPS) -> None:
        super().__init__()
        self.margin = margin
        self.recent = recent

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, peer: torch.Tensor, peer_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        both = (mask * peer_mask)[:, -self.recent :, :]
        gap = torch.abs(x - peer)[:, -self.recent :, :] * both
        deviation = torch.relu(gap.sum(dim=1) / (both.sum(dim=1) + 1.0) - self.margin)
        return deviation.sum(dim=1), deviation
