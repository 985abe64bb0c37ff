# PyTorch Lightning on Ray Train, as Ray's "Get Started with PyTorch Lightning" guide
# writes it (ResNet-18 on Fashion-MNIST, data-parallel): ray_lightning_fashion_mnist.py
# runs it on Ray, durabletrain_lightning_fashion_mnist.py on durabletrain; they differ
# in their imports only (`diff` them). As in durabletrain_resnet18.py, the scaling
# config reads NUM_WORKERS and asks for GPUs only where there are some, and the data
# and the epochs come from DATA_DIR and EPOCHS, so that CI runs it on 2 CPU ranks.
import os
import tempfile

import torch
from torch.utils.data import DataLoader
from torchvision.models import resnet18
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor, Normalize, Compose
import lightning.pytorch as pl

import durabletrain as ray
from durabletrain.train.torch import TorchTrainer
from durabletrain.train import ScalingConfig, RunConfig, CheckpointConfig

data_dir = os.environ.get("DATA_DIR", os.path.join(tempfile.gettempdir(), "data"))
epochs = int(os.environ.get("EPOCHS", "10"))


# Model, Loss, Optimizer
class ImageClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = resnet18(num_classes=10)
        self.model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        outputs = self.forward(x)
        loss = self.criterion(outputs, y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        outputs = self.forward(x)
        self.log("val_loss", self.criterion(outputs, y), sync_dist=True)
        self.log("val_accuracy", (outputs.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=0.001)


def train_func():
    # Data
    transform = Compose([ToTensor(), Normalize((0.28604,), (0.32025,))])
    train_data = FashionMNIST(root=data_dir, train=True, download=True, transform=transform)
    val_data = FashionMNIST(root=data_dir, train=False, download=True, transform=transform)
    train_dataloader = DataLoader(train_data, batch_size=128, shuffle=True)
    val_dataloader = DataLoader(val_data, batch_size=128)

    # Training
    model = ImageClassifier()
    # [1] Configure PyTorch Lightning Trainer.
    trainer = pl.Trainer(
        max_epochs=epochs,
        devices="auto",
        accelerator="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
        # [1a] Optionally, disable the default checkpointing behavior
        # in favor of the `RayTrainReportCallback` above.
        enable_checkpointing=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_dataloader, val_dataloaders=val_dataloader)


# [2] Configure scaling and resource requirements.
scaling_config = ScalingConfig(num_workers=int(os.environ.get("NUM_WORKERS", "2")), use_gpu=torch.cuda.is_available())

# [3] Launch distributed training job.
trainer = TorchTrainer(
    train_func,
    scaling_config=scaling_config,
    run_config=RunConfig(
        name="lightning_fashion_mnist",
        storage_path=os.path.join(data_dir, "lightning_ckpt"),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    ),
)
result: ray.train.Result = trainer.fit()

# [4] Load the trained model.
with result.checkpoint.as_directory() as checkpoint_dir:
    model = ImageClassifier.load_from_checkpoint(
        os.path.join(checkpoint_dir, ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME),
    )
print("val_accuracy", result.metrics["val_accuracy"])
