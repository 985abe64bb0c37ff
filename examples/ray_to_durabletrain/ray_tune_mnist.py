# The reference search (shared/reference/001: a Ray Tune Trainable run by tune.run
# with ASHA) as its document writes it: ray_tune_mnist.py runs it on Ray,
# durabletrain_tune_mnist.py on durabletrain; they differ in their imports only
# (`diff` them). As published but for: the helpers come from mnist_helpers.py (Ray's
# mnist_pytorch downloads MNIST, which no machine here reaches), the trial count,
# iterations and GPU come from NUM_SAMPLES, ITERATIONS and USE_GPU (defaults as
# published but the GPU: only where there is one). As published, it joins a cluster
# that is running (`ray start --head`; for durabletrain, durabletrain.init() in another
# process, or $TEMPORAL_ADDRESS).
import os

import torch
import torch.optim as optim

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune import CLIReporter

from mnist_helpers import train, test, get_data_loaders, ConvNet

USE_GPU = os.environ.get("USE_GPU", "1" if torch.cuda.is_available() else "0") == "1"


class MNISTTrainable(tune.Trainable):
    def setup(self, config):
        use_cuda = config.get("use_gpu") and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.train_loader, self.test_loader = get_data_loaders()
        self.model = ConvNet().to(self.device)
        self.optimizer = optim.SGD(
            self.model.parameters(),
            lr=config.get("lr", 0.01),
            momentum=config.get("momentum", 0.9))

    def step(self):
        train(self.model, self.optimizer, self.train_loader, device=self.device)
        acc = test(self.model, self.test_loader, self.device)
        return {"mean_accuracy": acc}

    def save_checkpoint(self, checkpoint_dir):
        checkpoint_path = os.path.join(checkpoint_dir, "checkpoint.bin")
        torch.save((self.model.state_dict(), self.optimizer.state_dict()), checkpoint_path)
        return checkpoint_path

    def load_checkpoint(self, checkpoint_path):
        model, optimizer = torch.load(checkpoint_path)
        self.model.load_state_dict(model)
        self.optimizer.load_state_dict(optimizer)


if __name__ == "__main__":
    # Initialise the cluster
    ray.init(address='auto')
    # Search the hyperparameters
    sched = ASHAScheduler(metric="mean_accuracy", mode="max")
    reporter = CLIReporter()
    analysis = tune.run(MNISTTrainable,
                        scheduler=sched,
                        progress_reporter=reporter,
                        stop={"mean_accuracy": 0.99,
                              "training_iteration": int(os.environ.get("ITERATIONS", "100"))},
                        resources_per_trial={"cpu": 2, "gpu": 1 if USE_GPU else 0},
                        num_samples=int(os.environ.get("NUM_SAMPLES", "128")),
                        config={"lr": tune.uniform(0.001, 1.0),
                                "momentum": tune.uniform(0.1, 0.9),
                                "use_gpu": USE_GPU})
    # Save the results
    analysis.results_df.to_csv("result.csv")
    # The best config
    print("Best config is:", analysis.get_best_config(metric="mean_accuracy", mode="max"))
