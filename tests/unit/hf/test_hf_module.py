"""trainer.hf in one process: the losses are transformers' own, the model's declarations become the
trainer's hooks, and every wrong input is one line before anything runs."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.support.hf_models import bert_config, gpt2_config, llama_config, save_model
from trainer.hf import HFCausalLM, HFSequenceClassification
from trainer.hf.causal_lm import shifted_labels


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("llama"), llama_config(), tokenizer=True)


def test_causal_lm_loss_is_transformers_own_with_padding(llama_dir):
    module = HFCausalLM(path=llama_dir, pretrained=False)
    module.configure_model()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (3, 10), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # right padding
    mask[2, 3:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    out = module.training_step(batch, 0)
    labels = ids.masked_fill(mask == 0, -100)
    expected = module.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=0)
    assert int(out["num_tokens"]) == int((shifted_labels(batch) != -100).sum()) == 5 + 9 + 2
    # The text recipes' (inputs, next tokens) pairs: the same loss as transformers' on the whole sequence.
    pair = module.training_step((ids[:, :-1], ids[:, 1:]), 0)
    torch.testing.assert_close(pair["loss"], module.model(input_ids=ids, labels=ids).loss, rtol=1e-5, atol=0)


@pytest.mark.parametrize("labels", ["single", "regression"])
def test_classification_loss_is_transformers_own(tmp_path, labels):
    config = bert_config(num_labels=1 if labels == "regression" else 3)
    module = HFSequenceClassification(config=config)
    module.configure_model()
    ids = torch.randint(1, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    target = torch.tensor([0, 2, 1, 1]) if labels == "single" else torch.randn(4)
    out = module.training_step((ids, mask, target), 0)
    expected = module.model(input_ids=ids, attention_mask=mask, labels=target).loss
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=0)


def test_declarations_become_the_trainers_hooks(llama_dir):
    module = HFCausalLM(path=llama_dir, pretrained=False)
    module.configure_model()
    assert [c.__name__ for c in module.block_classes()] == ["LlamaDecoderLayer"]
    plan = module.tensor_parallel_plan()
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    assert isinstance(plan["model.model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.model.layers.*.mlp.down_proj"], RowwiseParallel)
    assert isinstance(plan["model.lm_head"], ColwiseParallel)  # colwise_gather_output: whole logits
    from trainer.strategies.tensor_parallel import expand_plan

    expanded = expand_plan(module, plan)  # every name is a real submodule of the wrapper
    assert "model.model.layers.1.self_attn.o_proj" in expanded
    assert module.tokenizer is not None and module.tokenizer("abc")["input_ids"] == [0, 1, 2]
    assert module.initial_weights() is None  # pretrained=False
    assert HFCausalLM(path=llama_dir).initial_weights() == llama_dir


def test_a_hub_name_is_one_line_saying_pass_a_local_directory():
    with pytest.raises(ValueError, match=r"^module.path='meta-llama/Llama-3.2-1B' is not a local directory; models "
                                         r"are not downloaded at run time: .* pass its local directory$"):
        HFCausalLM(path="meta-llama/Llama-3.2-1B")


def test_a_directory_without_config_is_one_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"has no config.json; pass a directory written by save_pretrained"):
        HFCausalLM(path=str(tmp_path))


def test_an_index_naming_absent_shards_is_one_line(tmp_path):
    llama_config().save_pretrained(str(tmp_path))
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}, f)
    with pytest.raises(ValueError, match=r"names \['model-00001-of-00002.safetensors'\] which are not in the directory"):
        HFCausalLM(path=str(tmp_path))


def test_a_model_without_no_split_modules_is_refused_under_fsdp_before_any_worker(tmp_path):
    from tests.support.helpers import new_trainer

    module = HFSequenceClassification(config=bert_config())
    trainer = new_trainer(tmp_path, strategy="fsdp", devices=2)
    with pytest.raises(ValueError, match=r"BertForSequenceClassification declares no _no_split_modules, so FSDP "
                                         r"cannot find its blocks; pass its block class names as blocks="):
        trainer.fit(module)
    assert not os.path.exists(tmp_path / "metrics.jsonl")  # nothing ran
    HFSequenceClassification(config=bert_config(), blocks=["BertLayer"]).check_sharding_units()  # named: accepted


def test_a_wrong_plan_name_is_one_line(tmp_path):
    from trainer.strategies.nd import NDStrategy

    module = HFCausalLM(config=llama_config(), tp_plan={"model.model.layers.*.self_attn.q_prj": "colwise"})
    with pytest.raises(ValueError, match=r"names 'model.model.layers.\*.self_attn.q_prj', which is no submodule of "
                                         r"the model; did you mean"):
        NDStrategy(tp=2).check_module(module)
    unknown = HFCausalLM(config=llama_config(), tp_plan={"model.lm_head": "colwise_sideways"})
    with pytest.raises(ValueError, match=r"maps 'model.lm_head' to 'colwise_sideways', which has no torch "
                                         r"ParallelStyle here \(known: colwise, rowwise"):
        NDStrategy(tp=2).check_module(unknown)


def test_a_model_without_a_plan_under_tp_is_one_line():
    from trainer.strategies.nd import NDStrategy

    with pytest.raises(ValueError, match=r"strategy.tp=2 but GPT2Config declares no base_model_tp_plan; pass tp_plan="):
        NDStrategy(tp=2).check_module(HFCausalLM(config=gpt2_config()))
    with pytest.raises(ValueError, match=r"strategy.tp=3 does not divide the model's num_attention_heads=4"):
        NDStrategy(tp=3).check_module(HFCausalLM(config=llama_config()))


def test_pipeline_is_refused_in_one_line_before_any_worker():
    from trainer.strategies.nd import NDStrategy
    from trainer.strategies.pipeline import PipelineStrategy

    refusal = (r"^strategy=pipeline \(or strategy.pp > 1\) cannot cut LlamaForCausalLM into stages: .*; allowed: "
               r"strategy=single, ddp, fsdp or nd with pp=1 \(tensor parallel from the model's plan\)$")
    module = HFCausalLM(config=llama_config())
    for strategy in (PipelineStrategy(), NDStrategy(pp=2)):  # the check the Trainer runs before launching
        with pytest.raises(ValueError, match=refusal):
            strategy.check_module(module)
    with pytest.raises(ValueError, match=refusal):  # and where a rank or the estimator asks for the layers
        module.pipeline_layers()


def test_data_vocabulary_larger_than_the_model_is_one_line():
    module = HFCausalLM(config=llama_config(vocab_size=128), max_bytes=2000, block_size=8)
    with pytest.raises(ValueError, match=r"the data's vocabulary of 256 tokens exceeds the model's vocab_size=128"):
        module.train_dataset()


def test_init_from_a_directory_without_weights_is_one_line(tmp_path):
    from trainer import Trainer

    llama_config().save_pretrained(str(tmp_path))  # config.json alone
    with pytest.raises(ValueError, match=r"trainer.init_from='.*' is neither a file of weights nor a directory of "
                                         r"safetensors \(model.safetensors or model.safetensors.index.json\)"):
        Trainer(init_from=str(tmp_path))


def test_tied_embeddings_on_the_meta_device_are_refused():
    module = HFCausalLM(config=gpt2_config())
    with torch.device("meta"), pytest.raises(ValueError, match=r"GPT2LMHeadModel ties parameters .* set "
                                                               r"strategy.meta_init=false"):
        module.configure_model()


def test_activation_checkpointing_of_the_declared_blocks_trains_the_same(llama_dir, tmp_path):
    from tests.support.helpers import fit
    from tests.support.hf_models import TinyCausalLM

    plain = fit(tmp_path / "plain", TinyCausalLM(path=llama_dir, pretrained=False), strategy="single", devices=1,
                batch_size=4, max_steps=3)
    recomputed = fit(tmp_path / "ac", TinyCausalLM(path=llama_dir, pretrained=False), strategy="single", devices=1,
                     batch_size=4, max_steps=3, activation_checkpointing=True)
    from tests.support.same_training import assert_same_training

    assert_same_training(recomputed, plain, steps=3, tol=dict(rtol=1e-6, atol=1e-7))


def test_tied_gpt2_starts_from_its_weights(tmp_path):
    from tests.support.helpers import fit
    from tests.support.hf_models import FirstBatchLM
    from transformers import AutoModelForCausalLM

    directory = save_model(tmp_path / "gpt2", gpt2_config(), seed=5)
    module = FirstBatchLM(path=directory)
    losses, _ = fit(tmp_path / "run", module, strategy="single", devices=1, batch_size=8, max_steps=1)
    batch = module.first_batch()
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(directory)(input_ids=batch, labels=batch).loss
    torch.testing.assert_close(torch.tensor(losses[0]), expected, rtol=1e-5, atol=1e-6)


def test_a_classifier_exports_to_a_directory_from_pretrained_reads(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from trainer.hf.export import export_pretrained

    module = HFSequenceClassification(config=bert_config())
    module.configure_model()
    export_pretrained(module.state_dict(), module.hf_config, str(tmp_path / "out"), module.auto_class)
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
    module.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, module.model(input_ids=ids).logits, rtol=1e-5,
                                   atol=1e-6)


def test_the_classification_recipes_data_and_its_refusals():
    from trainer.recipes.hf_classification import HFSequenceClassifierRecipe

    module = HFSequenceClassifierRecipe(config=bert_config(), num_samples=32, val_samples=8, seq_len=8)
    ids, mask, labels = module.train_dataset().tensors
    assert ids.shape == mask.shape == (32, 8) and (ids[mask == 0] == 0).all() and (ids[mask == 1] > 0).all()
    assert (labels == ids[:, 0] % 3).all()  # the first token's class
    again = HFSequenceClassifierRecipe(config=bert_config(), num_samples=32, val_samples=8, seq_len=8)
    assert torch.equal(again.train_dataset().tensors[0], ids)  # every process the same rows
    assert not torch.equal(module.val_dataset().tensors[0], ids[:8])  # validation: other rows
    with pytest.raises(ValueError, match=r"the generated data are single-label classes, and the model's config has "
                                         r"num_labels=1"):
        HFSequenceClassifierRecipe(config=bert_config(num_labels=1))
    with pytest.raises(ValueError, match=r"module.seq_len=64 must be between 2 and the model's "
                                         r"max_position_embeddings=32"):
        HFSequenceClassifierRecipe(config=bert_config(), seq_len=64)
