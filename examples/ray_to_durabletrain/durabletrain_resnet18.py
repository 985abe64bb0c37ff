# The reference program (shared/reference/000: Ray Train with PyTorch, data-parallel
# ResNet-18 on Fashion-MNIST) as Ray's documentation writes it: ray_train_resnet18.py
# runs it on Ray, durabletrain_resnet18.py on durabletrain; they differ in their
# imports only (`diff` them). One line differs from the published reference in both:
# the scaling config reads NUM_WORKERS (default 4, as published) and asks for GPUs
# only where there are some, so that CI runs it on 2 CPU ranks.
import os
import tempfile

import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torchvision.models import resnet18

import durabletrain as ray
import durabletrain.train.torch
from durabletrain.train import Checkpoint


def train_func(model, optimizer, criterion, train_loader):
    # device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.train()
    for data, target in train_loader:
        # No need to manually send images and labels to a specific GPU
        # `prepare_data_loader` helps with this process
        # data, target = data.to(device), target.to(device)
        output = model(data)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_func(model, data_loader):
    # device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for data, target in data_loader:
            # data, target = data.to(device), target.to(device)
            outputs = model(data)
            _, predicted = torch.max(outputs.data, 1)
            total += target.size(0)
            correct += (predicted == target).sum().item()

    return correct / total


data_dir = os.path.join(os.getcwd(), "../data")


def train_loop():
    # Load data and perform data augmentation
    transform = torchvision.transforms.Compose(
        [torchvision.transforms.ToTensor(),
         torchvision.transforms.Normalize((0.5,), (0.5,))]
    )

    train_loader = DataLoader(
        torchvision.datasets.FashionMNIST(root=data_dir, train=True, download=True, transform=transform),
        batch_size=128,
        shuffle=True)
    test_loader = DataLoader(
        torchvision.datasets.FashionMNIST(root=data_dir, train=False, download=True, transform=transform),
        batch_size=128,
        shuffle=True)

    # 1. Distribute data to multiple computing nodes
    train_loader = ray.train.torch.prepare_data_loader(train_loader)
    test_loader = ray.train.torch.prepare_data_loader(test_loader)

    # The original resnet is designed for 3-channel images
    # FashionMNIST is 1 channel, modify the first layer of resnet to adapt to this input
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(
        1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False
    )

    # 2. Distribute the model to multiple computing nodes and GPUs
    model = ray.train.torch.prepare_model(model)
    criterion = nn.CrossEntropyLoss()

    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)

    # Train for 10 epochs
    for epoch in range(10):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)

        train_func(model, optimizer, criterion, train_loader)
        acc = test_func(model, test_loader)

        # 3. Monitor training metrics and save checkpoints
        metrics = {"acc": acc, "epoch": epoch}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(
                model.state_dict(),
                os.path.join(temp_checkpoint_dir, "model.pt")
            )
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if ray.train.get_context().get_world_rank() == 0:
            print(metrics)


# 4. Configure `ScalingConfig`, Ray Train will expand the training task to the cluster according to this configuration
scaling_config = ray.train.ScalingConfig(num_workers=int(os.environ.get("NUM_WORKERS", "4")), use_gpu=torch.cuda.is_available())

# 5. Start parallel training using TorchTrainer
trainer = ray.train.torch.TorchTrainer(
    train_loop_per_worker=train_loop,
    scaling_config=scaling_config,
    run_config=ray.train.RunConfig(
        storage_path=os.path.join(data_dir, "torch_ckpt"),
        name="exp_fashionmnist_resnet18",
    )
)
result = trainer.fit()
