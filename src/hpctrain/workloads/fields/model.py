"""A small pre-activation ResNet with GroupNorm for periodic 2-D maps.

GroupNorm normalises each map on its own, so the statistics do not depend on the per-GPU batch size; it also
removes the map's overall amplitude, which carries sigma_8, so the head also receives log <x^2> of the input.
Convolutions pad circularly because the maps are periodic.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, padding_mode="circular", bias=False)


class ResBlock(nn.Module):
    """GN -> GELU -> conv -> GN -> GELU -> conv, plus the (projected) input."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in)
        self.conv1 = _conv(c_in, c_out, stride)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.conv2 = _conv(c_out, c_out)
        self.act = nn.GELU()
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.act(self.norm1(x)))  # (B, c_out, H/stride, W/stride)
        h = self.conv2(self.act(self.norm2(h)))
        return self.skip(x) + h


class FieldCNN(nn.Module):
    def __init__(
        self,
        widths: list[int],
        blocks: int,
        groups: int,
        head_hidden: int,
        outputs: int,
        gradient_checkpointing: bool = False,
        channels_last: bool = False,
        stem_stride: int = 1,
    ) -> None:
        super().__init__()
        self.gradient_checkpointing = gradient_checkpointing
        self.channels_last = channels_last
        self.stem = _conv(1, widths[0], stem_stride)
        layers = []
        c_in = widths[0]
        for stage, width in enumerate(widths):
            for b in range(blocks):
                stride = 2 if stage > 0 and b == 0 else 1
                layers.append(ResBlock(c_in, width, stride, groups))
                c_in = width
        self.blocks = nn.ModuleList(layers)
        self.norm = nn.GroupNorm(groups, c_in)
        self.head = nn.Sequential(
            nn.Linear(c_in + 1, head_hidden), nn.GELU(), nn.Linear(head_hidden, outputs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Maps (B, 1, N, N) -> outputs (B, outputs)."""
        amplitude = torch.log(x.float().square().mean(dim=(1, 2, 3)) + 1e-8).unsqueeze(1)  # (B, 1)
        if self.channels_last and x.is_cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        h = self.stem(x)  # (B, C0, N/stem_stride, N/stem_stride)
        for block in self.blocks:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                # Keeps only each block's input; its activations are recomputed in backward.
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        pooled = torch.nn.functional.gelu(self.norm(h)).mean(dim=(2, 3))  # (B, C)
        return self.head(torch.cat([pooled, amplitude.to(pooled.dtype)], dim=1))
