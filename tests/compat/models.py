"""Small versions of the models the peers' READMEs use (torchinfo's LSTMNet and ResNet, torchscan's
VGG, DeepSpeed's CNN), with their costs derived by hand in the tests."""

from collections import OrderedDict

import torch
from torch import nn


class LSTMNet(nn.Module):
    """torchinfo README's LSTMNet, shrunk: vocab 20, embed 30, hidden 16, 2 layers."""

    def __init__(self, vocab_size=20, embed_dim=30, hidden_dim=16, num_layers=2):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.encoder = nn.LSTM(embed_dim, hidden_dim, num_layers=num_layers, batch_first=True)
        self.decoder = nn.Linear(hidden_dim, vocab_size)

    def forward(self, x):
        embed = self.embedding(x)
        out, hidden = self.encoder(embed)
        out = self.decoder(out)
        out = out.view(-1, out.size(2))
        return out, hidden


class Block(nn.Module):
    """A ResNet basic block without norms: conv3x3 -> relu -> conv3x3, plus the input."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))) + x)


class TinyResNet(nn.Module):
    """torchinfo README's ResNet example, shrunk: stem, layer1 (2 blocks), layer2 (1 block), fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(Block(4), Block(4))
        self.layer2 = nn.Sequential(Block(4))
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.relu(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


class CNN(nn.Module):
    """DeepSpeed's get_model_profile example, on a small CNN instead of AlexNet."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def vgg_like():
    """torchscan README's VGG example, shrunk."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Sequential(nn.Conv2d(8, 4, 3), nn.ReLU()), nn.Flatten(), nn.Linear(4 * 5 * 5, 10))


def state(model: nn.Module):
    """Everything an analysis must leave as it was."""
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [m.training for m in model.modules()], [p.requires_grad for p in model.parameters()],
            [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
            sorted(k for m in model.modules() for k in vars(m) if k.startswith("__")))


def same_state(a, b) -> bool:
    return (a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
            and a[1:] == b[1:])


class FrozenTied(nn.Module):
    """Long attribute names (torchscan wraps them), a frozen head, a module called twice (shared) and
    BatchNorm buffers: the front ends' printed variants for trainable/frozen/shared/buffers."""

    def __init__(self):
        super().__init__()
        self.feature_extractor_backbone = nn.Sequential(OrderedDict(
            first_convolution_layer_3x3=nn.Conv2d(3, 4, 3, padding=1), batch_normalisation=nn.BatchNorm2d(4),
            activation=nn.ReLU()))
        self.frozen_projection_head = nn.Linear(4, 4).requires_grad_(False)
        self.shared_output_projection = nn.Linear(4, 4)

    def forward(self, x):
        h = self.frozen_projection_head(self.feature_extractor_backbone(x).mean((2, 3)))
        return self.shared_output_projection(self.shared_output_projection(h))
