"""Write a tiny Llama that vLLM loads from a folder, and whose greedy replies to the judge are
short valid grades: `python tests/vllm_tiny_model.py DIR`, with the Python vLLM runs on.

No hub: its tokenizer is byte-level (256 bytes and three specials, no merges), made here. Its
weights make every logit depend on the token alone: attention and MLP outputs are zero, each
embedding is a large constant in dimension 0, the final norm keeps only that dimension, and
the output layer ranks `</s> " } , : 0` first and whitespace last. Under the json_schema
grammar vLLM enforces, greedy decoding then writes
{"reasoning":"","completeness":0,"conciseness":0}: a reply ragexam reads as an ok grade.
"""

from __future__ import annotations

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<s>", "</s>", "<pad>"]
CHAT = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
FIRST = [(10, "</s>"), (8, '"'), (6, "}"), (4, ","), (3, ":"), (2, "0")]


def main(folder: str) -> None:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(SPECIALS + alphabet)}
    bytes_level = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bytes_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bytes_level.decoder = decoders.ByteLevel()
    bytes_level.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bytes_level,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT,
        model_max_length=4096,
    )
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        embeddings.normal_(0, 1e-3)
        embeddings[:, 0] = 10.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        output = model.lm_head.weight
        output.zero_()
        output[:, 0] = torch.linspace(-1, 0, len(vocab))  # the rest: small and distinct
        for score, token in FIRST:
            output[tokenizer.convert_tokens_to_ids(token), 0] = score
        for token in alphabet:  # the grammar allows whitespace anywhere: never choose it
            if tokenizer.convert_tokens_to_string([token]).isspace():
                output[tokenizer.convert_tokens_to_ids(token), 0] = -5
    model.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


if __name__ == "__main__":
    main(sys.argv[1])
