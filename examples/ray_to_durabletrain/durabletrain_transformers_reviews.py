# Hugging Face Transformers on Ray Train, as Ray's "Get Started with Hugging Face
# Transformers" guide writes it (a BERT text classifier fine-tuned by transformers.Trainer,
# data-parallel): ray_transformers_reviews.py runs it on Ray,
# durabletrain_transformers_reviews.py on durabletrain; they differ in their imports
# only (`diff` them). No model hub is reachable here, so the BERT is a small one built
# from its config and the reviews are generated (a word-level tokenizer over their
# words); the rest is the guide's. NUM_WORKERS and EPOCHS set the scale, for CI's 2 CPU ranks.
import os
import random

import numpy as np
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

import durabletrain as ray
from durabletrain.train import ScalingConfig, RunConfig
from durabletrain.train.torch import TorchTrainer

epochs = int(os.environ.get("EPOCHS", "3"))
GOOD = ["good", "great", "tasty", "friendly", "fast", "clean", "lovely"]
BAD = ["bad", "awful", "cold", "rude", "slow", "dirty", "bland"]
FILLER = ["the", "food", "was", "and", "staff", "service", "place", "very", "really", "our"]


def reviews(n, seed):
    """n short restaurant reviews and their star ratings (0: negative, 1: positive)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = rng.choices(FILLER, k=6) + rng.choices(GOOD if label else BAD, k=2)
        rng.shuffle(words)
        out.append({"text": " ".join(words), "label": label})
    return out


def tokenizer():
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + GOOD + BAD + FILLER)}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


class Tokenized(torch.utils.data.Dataset):
    def __init__(self, rows, tok):
        self.enc = tok([r["text"] for r in rows], padding="max_length", max_length=12, truncation=True)
        self.labels = [r["label"] for r in rows]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        item = {k: torch.tensor(v[i]) for k, v in self.enc.items()}
        item["labels"] = self.labels[i]
        return item


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


# [1] Encapsulate data preprocessing, training, and evaluation
# logic in a training function
# ============================================================
def train_func():
    # Datasets
    tok = tokenizer()
    train_dataset = Tokenized(reviews(512, seed=0), tok)
    eval_dataset = Tokenized(reviews(128, seed=1), tok)

    # Model
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)

    # Hugging Face Trainer
    training_args = TrainingArguments(
        output_dir="test_trainer",
        eval_strategy="epoch",
        save_strategy="epoch",
        num_train_epochs=epochs,
        per_device_train_batch_size=16,
        learning_rate=5e-4,
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
    )

    # [2] Report Metrics and Checkpoints to Ray Train
    # ===============================================
    callback = ray.train.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)

    # [3] Prepare Transformers Trainer
    # ================================
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)

    # Start Training
    trainer.train()


# [4] Define a Ray TorchTrainer to launch `train_func` on all workers
# ===================================================================
ray_trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(num_workers=int(os.environ.get("NUM_WORKERS", "2")), use_gpu=torch.cuda.is_available()),
    run_config=RunConfig(name="transformers_reviews"),
)
result: ray.train.Result = ray_trainer.fit()

# [5] Load the trained model.
with result.checkpoint.as_directory() as checkpoint_dir:
    checkpoint_path = os.path.join(
        checkpoint_dir,
        ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME,
    )
    model = BertForSequenceClassification.from_pretrained(checkpoint_path)
print("eval_accuracy", result.metrics["eval_accuracy"])
