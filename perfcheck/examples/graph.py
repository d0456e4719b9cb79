"""A graph transformer built from PyTorch Geometric's ``TransformerConv`` (the graph attention of
Shi et al. 2021, "Masked Label Prediction", arXiv 2009.03509): 11 TransformerConv(in, 256, heads=32,
concat=False) layers (in = 9, then 256), 10 LayerNorm(256), a Dropout, a ReLU and
post_mp = Linear(256, 1): 64,071,937 parameters, the "64.07 M" DeepSpeed's Flops Profiler prints for
it. Its time goes to gathers and scatters over edges (index_select, scatter_add_), work a roofline of
FLOPs and streamed bytes underestimates. Needs torch_geometric (``pip install torch-geometric``)."""
from __future__ import annotations

import torch.nn as nn


class GraphTransformer(nn.Module):
    def __init__(self, in_dim: int = 9, hidden: int = 256, heads: int = 32, layers: int = 11, dropout: float = 0.0):
        super().__init__()
        from torch_geometric.nn import TransformerConv

        self.convs = nn.ModuleList(
            [TransformerConv(in_dim if i == 0 else hidden, hidden, heads=heads, concat=False) for i in range(layers)])
        self.lns = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(layers - 1)])
        self.conv_dropout = nn.Dropout(dropout)
        self.ReLU = nn.ReLU()  # noqa: N815 - keeps the profiled model's attribute name
        self.post_mp = nn.Sequential(nn.Linear(hidden, 1))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.lns):
                x = self.lns[i](self.conv_dropout(self.ReLU(x)))
        return self.post_mp(x)
