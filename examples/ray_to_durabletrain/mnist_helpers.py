"""What the reference search (shared/reference/001) imports from
ray.tune.examples.mnist_pytorch (train, test, get_data_loaders, ConvNet),
with the same names and signatures, over Fashion-MNIST IDX files read
from disk ($FASHION_MNIST, default Debian's dataset-fashion-mnist) instead
of a download: neither Ray's nor our machines reach the internet here.
$MNIST_LIMIT bounds the images of each split."""

import gzip
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EPOCH_SIZE = 512
TEST_SIZE = 256


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, kernel_size=3)
        self.fc = nn.Linear(192, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 3))
        x = x.view(-1, 192)
        x = self.fc(x)
        return F.log_softmax(x, dim=1)


def train(model, optimizer, train_loader, device=None):
    device = device or torch.device("cpu")
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        if batch_idx * len(data) > EPOCH_SIZE:
            return
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def test(model, data_loader, device=None):
    device = device or torch.device("cpu")
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for batch_idx, (data, target) in enumerate(data_loader):
            if batch_idx * len(data) > TEST_SIZE:
                break
            data, target = data.to(device), target.to(device)
            outputs = model(data)
            _, predicted = torch.max(outputs.data, 1)
            total += target.size(0)
            correct += (predicted == target).sum().item()
    return correct / total


def _idx(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    n = min(n, limit)
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        x = torch.frombuffer(bytearray(data[16:16 + n * rows * cols]), dtype=torch.uint8).view(n, 1, rows, cols)
        return (x.float() / 255.0 - 0.1307) / 0.3081
    return torch.frombuffer(bytearray(data[8:8 + n]), dtype=torch.uint8).long()


def get_data_loaders(batch_size=64):
    root = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
    limit = int(os.environ.get("MNIST_LIMIT", "60000"))
    train_set = TensorDataset(_idx(os.path.join(root, "train-images-idx3-ubyte.gz"), limit),
                              _idx(os.path.join(root, "train-labels-idx1-ubyte.gz"), limit))
    test_set = TensorDataset(_idx(os.path.join(root, "t10k-images-idx3-ubyte.gz"), limit),
                             _idx(os.path.join(root, "t10k-labels-idx1-ubyte.gz"), limit))
    return (DataLoader(train_set, batch_size=batch_size, shuffle=True),
            DataLoader(test_set, batch_size=batch_size, shuffle=True))
