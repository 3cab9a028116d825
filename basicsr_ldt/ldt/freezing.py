"""Freezing that really saves backward work.

A frozen tensor gets ``requires_grad=False`` so autograd skips its weight gradient. One case
defeats that on CPU (measured, torch 2.15, oneDNN): a convolution whose weight is frozen but
whose bias trains runs the fused weight+bias backward kernel, i.e. it computes the weight
gradient anyway (same cost as training both). Since LDT partitions per tensor, weight and bias
of one conv often land in different groups. For those convs we compute
``conv(x, W, None) + b``: the conv's backward then only needs the input gradient and the bias
gradient is a cheap reduction. Numerically this differs from the fused kernel only by float
rounding order; it is installed per module instance and removed as soon as the pattern ends.
On CUDA the fused convolution already skips the weight gradient (PyTorch's ``convolution_backward``
asks cuDNN for the input and weight gradients its output mask names and sums the bias gradient
apart, aten/src/ATen/native/Convolution.cpp), and the split would only add operators to a step
that its launches bound: CUDA inputs take the fused convolution.
"""
from __future__ import annotations

import types
from typing import Collection

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd

#: The per-instance method installed on a routed convolution (set aside by archs/compile.py's
#: compiled calls, which train every tensor).
ROUTED_METHOD = '_conv_forward'


def _on_gpu(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _bias_apart_forward(self: _ConvNd, input: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None or _on_gpu(input):
        return type(self)._conv_forward(self, input, weight, bias)
    out = type(self)._conv_forward(self, input, weight, None)
    # in place is safe: convolution backward does not read its output
    return out.add_(bias.view(1, -1, *([1] * (out.dim() - 2))))


def set_trainable(module: nn.Module, trainable: Collection[str]) -> None:
    """requires_grad = (name in trainable) for every parameter, then fix up conv backward."""
    for name, param in module.named_parameters():
        param.requires_grad_(name in trainable)
    route_bias_only_convs(module)


def route_bias_only_convs(module: nn.Module) -> int:
    """Install the split conv+bias forward where weight is frozen and bias trains; count them."""
    installed = 0
    for sub in module.modules():
        if not isinstance(sub, _ConvNd) or sub.transposed:
            continue
        split = (sub.bias is not None and sub.bias.requires_grad and not sub.weight.requires_grad)
        if split:
            setattr(sub, ROUTED_METHOD, types.MethodType(_bias_apart_forward, sub))
            installed += 1
        elif ROUTED_METHOD in sub.__dict__:
            delattr(sub, ROUTED_METHOD)
    return installed


def clear_routing(module: nn.Module) -> None:
    """Remove every per-instance conv override (before handing a module to other code)."""
    for sub in module.modules():
        if isinstance(sub, _ConvNd) and ROUTED_METHOD in sub.__dict__:
            delattr(sub, ROUTED_METHOD)
