"""Tiny random transformers models saved with ``save_pretrained`` into a directory (nothing downloads),
and the test modules that train them (importable by the trainer's spawned workers)."""

from __future__ import annotations

import os
from functools import partial

import torch
from torch.utils.data import TensorDataset

from trainer.hf import HFCausalLM, HFSequenceClassification

VOCAB = 256  # the byte text's vocabulary: the text recipes' default data trains these models


def llama_config(**overrides):
    from transformers import LlamaConfig

    settings = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    settings.update(overrides)
    return LlamaConfig(**settings)


def gpt2_config(**overrides):
    from transformers import GPT2Config

    settings = dict(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0)
    settings.update(overrides)
    return GPT2Config(**settings)


def bert_config(**overrides):
    from transformers import BertConfig

    settings = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                    max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    settings.update(overrides)
    return BertConfig(**settings)


def save_model(directory, config, auto: str = "AutoModelForCausalLM", seed: int = 0, max_shard_size=None,
               tokenizer: bool = False) -> str:
    """A random model of ``config`` saved to ``directory`` (safetensors; sharded with an index when
    ``max_shard_size`` is given); ``tokenizer``: a small byte-level tokenizer saved beside it."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, auto).from_config(config)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(directory), **kwargs)
    if tokenizer:
        save_tokenizer(directory)
    return str(directory)


def save_tokenizer(directory) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(ord("a") + i): i for i in range(26)}
    vocab["[UNK]"] = 26
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(str(directory))


def classification_data(num_samples: int, seed: int = 5, vocab: int = 64, length: int = 8) -> TensorDataset:
    """Token sequences with padding (a random length each) and 3 classes."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (num_samples, length), generator=generator)
    lengths = torch.randint(2, length + 1, (num_samples,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    labels = (ids[:, 0] % 3).long()
    return TensorDataset(ids * mask, mask, labels)


def save_params(module, name: str = "params.pt") -> None:
    """The full final parameters to ``<run_dir>/params.pt`` (every rank gathers: a collective)."""
    state = module.trainer.strategy.full_state_dict(module)
    if state:
        torch.save(state, os.path.join(module.trainer.run_dir, name))


def sgd(lr: float = 0.5):
    """The optimizer of most equivalence tests (the Llama layouts use ``adamw``). Adam divides each
    gradient by its running RMS, so a gradient that is near zero as a sum of cancelling contributions
    (a rare token's embedding row) has its last-bit differences between layouts scaled up with the
    rate; SGD keeps them in the last bits at any rate."""
    return partial(torch.optim.SGD, lr=lr, momentum=0.9)


def adamw(lr: float = 1e-3):
    """The recipes' default optimizer, at a rate small enough for the last-bit differences between
    layouts to stay in the last bits over 15 steps (see ``sgd``)."""
    return partial(torch.optim.AdamW, lr=lr)


class TinyCausalLM(HFCausalLM):
    """HFCausalLM on a little of the byte text, saving its final parameters (tests' ``fit``); SGD
    at ``lr`` unless ``optimizer`` is given."""

    def __init__(self, path=None, config=None, lr: float = 0.03, optimizer=None, **kwargs):
        kwargs.setdefault("max_bytes", 20_000)
        kwargs.setdefault("block_size", 16)
        super().__init__(path=path, config=config, optimizer=optimizer or sgd(lr), **kwargs)

    def on_fit_end(self):
        super().on_fit_end()
        save_params(self)


class TinyClassifier(HFSequenceClassification):
    """HFSequenceClassification on ``classification_data``, saving its final parameters."""

    def __init__(self, path=None, config=None, lr: float = 0.1, **kwargs):
        super().__init__(path=path, config=config, optimizer=sgd(lr), **kwargs)

    def train_dataset(self):
        return classification_data(64)

    def on_fit_end(self):
        super().on_fit_end()
        save_params(self)


class FirstBatchLM(TinyCausalLM):
    """The first ``GLOBAL`` blocks of the byte text as the whole training set, so the first global
    batch holds exactly them (in some order: the mean loss does not depend on it). Each rank writes
    ``load_rank<r>.json``: the bytes it read from the safetensors files (every read counted where
    torch's HuggingFaceStorageReader copies a slice in), its largest single read and the bytes of
    its own parameters."""

    samples = 8

    def train_dataset(self):
        from torch.utils.data import Subset

        return Subset(super().train_dataset(), range(self.samples))

    def first_batch(self):
        """The training set as transformers takes it: whole sequences (inputs and their last target)."""
        rows = [super(FirstBatchLM, self).train_dataset()[i] for i in range(self.samples)]
        return torch.stack([torch.cat([x, y[-1:]]) for x, y in rows])

    def configure_model(self):
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        reads = self._reads = []
        original = self._original_read = HuggingFaceStorageReader._process_read_request

        def counted(reader, f, request, planner):
            numel = 1
            for length in request.lengths:
                numel *= length
            reads.append(numel * 4)  # the files hold fp32
            return original(reader, f, request, planner)

        HuggingFaceStorageReader._process_read_request = counted
        super().configure_model()

    def on_fit_start(self):
        import json

        from torch.distributed.checkpoint import HuggingFaceStorageReader

        from trainer.runtime.tensors import local_tensor

        HuggingFaceStorageReader._process_read_request = self._original_read  # this process only
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        mine = sum(local_tensor(p).numel() * 4 for p in self.parameters())
        with open(os.path.join(self.trainer.run_dir, f"load_rank{rank}.json"), "w") as f:
            json.dump({"bytes_read": sum(self._reads), "largest_read": max(self._reads, default=0),
                       "reads": len(self._reads), "param_bytes": mine}, f)
