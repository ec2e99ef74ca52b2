#!/usr/bin/env python3
"""Fixtures for the architecture tests (engine/tests/arch_fixtures.rs): one tiny random-weight
model per supported architecture, with the logits and chat prompts Hugging Face transformers
computes for it.

For each model in MODELS this writes engine/tests/fixtures/arch/<name>/:
  config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json (with the
  family's real chat template), and, with --converter, model.gguf (bf16) made by llama.cpp's
  own converter (convert_hf_to_gguf.py) from those files;
  expected.json: for fixed token prompts, the greedy continuation and transformers' logits for
  the prompt's last position and each decode step (float32 math on the bf16 weights, eager
  attention), and for fixed conversations, apply_chat_template's text and token ids.

Setup (CI needs only the committed fixtures, never this script):
    python3 -m venv VENV && VENV/bin/pip install torch transformers safetensors jinja2
    VENV/bin/python scripts/gen-arch-fixtures.py [--converter PATH/convert_hf_to_gguf.py]

The converter's `conversion` package is looked for beside the script or in --converter-modules,
and it needs the gguf-py of its own llama.cpp release on PYTHONPATH (PyPI's `gguf` may be older
than the converter and then fails on architectures it does not know).
The fixture tokenizer (a small byte-level BPE with SmolLM's pre-tokenization) is not one
llama.cpp's tokenizer-hash table knows, so its pre-tokenizer name is given ("smollm"); every
tensor and hyper-parameter is the converter's own.

Each model switches its family's quirks on: Qwen2's Q/K/V biases and tied embeddings,
Qwen3's QK-norm and a head_dim other than hidden/heads, Mistral's sliding window (shorter than
the prompts), Llama 3's rope scaling, Gemma 3's interleaved sliding and global layers with
their own RoPE bases, query_pre_attn_scalar, final logit softcapping. Configs are written as
the published checkpoints write them (rope_theta / rope_scaling), except Llama's, which is
what transformers' save_pretrained writes now (rope_parameters), so both forms are read.
"""
import argparse
import copy
import json
import os
import runpy
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "engine" / "tests" / "fixtures" / "arch"

CORPUS = (
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog. What is the "
    "capital of Germany? Berlin is the capital of Germany. A language model predicts the next "
    "token of a text. Hello, how are you? I am fine, thank you. The engine serves tokens to "
    "the tenants of the pool. system user assistant model 1234567890"
)

# Token prompts: longer than every sliding window below, so windows matter.
PROMPTS = [
    [5, 60, 100, 7, 150, 22, 90, 41, 200, 13, 77, 120],
    [9, 33, 180, 64, 11, 250, 3],
]
DECODE_STEPS = 4

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany?"},
    ],
    [{"role": "user", "content": "Hello, how are you?"}],
]

SHAPE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)

# --- Chat templates, as the families publish them (tokenizer_config.json "chat_template"). ---

LLAMA31_TEMPLATE = '{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = "26 Jul 2024" %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0][\'role\'] == \'system\' %}\n    {%- set system_message = messages[0][\'content\']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = "" %}\n{%- endif %}\n\n{#- System message + builtin tools #}\n{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n{%- if builtin_tools is defined or tools is not none %}\n    {{- "Environment: ipython\\n" }}\n{%- endif %}\n{%- if builtin_tools is defined %}\n    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") + "\\n\\n"}}\n{%- endif %}\n{{- "Cutting Knowledge Date: December 2023\\n" }}\n{{- "Today Date: " + date_string + "\\n\\n" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n    {{- "Do not use variables.\\n\\n" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- "\\n\\n" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- "<|eot_id|>" }}\n\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0][\'content\']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n{%- endif %}\n    {{- \'<|start_header_id|>user<|end_header_id|>\\n\\n\' -}}\n    {{- "Given the following functions, please respond with a JSON for a function call " }}\n    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n    {{- "Do not use variables.\\n\\n" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- "\\n\\n" }}\n    {%- endfor %}\n    {{- first_user_message + "<|eot_id|>"}}\n{%- endif %}\n\n{%- for message in messages %}\n    {%- if not (message.role == \'ipython\' or message.role == \'tool\' or \'tool_calls\' in message) %}\n        {{- \'<|start_header_id|>\' + message[\'role\'] + \'<|end_header_id|>\\n\\n\'+ message[\'content\'] | trim + \'<|eot_id|>\' }}\n    {%- elif \'tool_calls\' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception("This model only supports single tool-calls at once!") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n            {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' -}}\n            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n            {%- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_name + \'="\' + arg_val + \'"\' }}\n                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- endif %}\n                {%- endfor %}\n            {{- ")" }}\n        {%- else  %}\n            {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' -}}\n            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n            {{- \'"parameters": \' }}\n            {{- tool_call.arguments | tojson }}\n            {{- "}" }}\n        {%- endif %}\n        {%- if builtin_tools is defined %}\n            {#- This means we\'re in ipython mode #}\n            {{- "<|eom_id|>" }}\n        {%- else %}\n            {{- "<|eot_id|>" }}\n        {%- endif %}\n    {%- elif message.role == "tool" or message.role == "ipython" %}\n        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- "<|eot_id|>" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' }}\n{%- endif %}\n'

QWEN25_TEMPLATE = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"

QWEN3_TEMPLATE = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n    {%- endif %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n        {%- if message.reasoning_content is string %}\n            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if '</think>' in content %}\n                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or (not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}"

MISTRAL_NEMO_TEMPLATE = "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{%- for message in loop_messages | rejectattr(\"role\", \"equalto\", \"tool\") | rejectattr(\"role\", \"equalto\", \"tool_results\") | selectattr(\"tool_calls\", \"undefined\") %}\n    {%- if (message[\"role\"] == \"user\") != (loop.index0 % 2 == 0) %}\n        {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS][\" }}\n            {%- for tool in tools %}\n        {%- set tool = tool.function %}\n        {{- '{\"type\": \"function\", \"function\": {' }}\n        {%- for key, val in tool.items() if key != \"return\" %}\n            {%- if val is string %}\n            {{- '\"' + key + '\": \"' + val + '\"' }}\n            {%- else %}\n            {{- '\"' + key + '\": ' + val|tojson }}\n            {%- endif %}\n            {%- if not loop.last %}\n            {{- \", \" }}\n            {%- endif %}\n        {%- endfor %}\n        {{- \"}}\" }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                    {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"tool_calls\" or message.tool_calls is defined %}\n        {%- if message.tool_calls is defined %}\n            {%- set tool_calls = message.tool_calls %}\n        {%- else %}\n            {%- set tool_calls = message.content %}\n        {%- endif %}\n        {{- \"[TOOL_CALLS][\" }}\n        {%- for tool_call in tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- message[\"content\"] + eos_token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- endif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"

GEMMA3_TEMPLATE = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n"

# --- Families: special tokens (ids 0..), their roles, the template. ---

FAMILIES = {
    "llama3": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        roles=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
        template=LLAMA31_TEMPLATE,
    ),
    "qwen25": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        roles=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        template=QWEN25_TEMPLATE,
    ),
    "qwen3": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        roles=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        template=QWEN3_TEMPLATE,
    ),
    "mistral": dict(
        specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                  "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]"],
        roles=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        template=MISTRAL_NEMO_TEMPLATE,
    ),
    "gemma3": dict(
        specials=["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                  "<start_of_image>"],
        roles=dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"),
        template=GEMMA3_TEMPLATE,
    ),
}

# --- Models: config.json (architectures and the family's quirks), family, GGUF. ---
# `gguf_positions`: how many leading positions of each prompt the GGUF file must match
# transformers on (None: all). llama.cpp's converter drops Mistral's window, so its GGUF
# matches only where the window does not cut.

MODELS = {
    "llama3": dict(
        family="llama3", gguf=True, gguf_positions=None, rope_parameters_format=True,
        config=dict(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=3,
                    rope_theta=500000.0, max_position_embeddings=512, tie_word_embeddings=False,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=16)),
    ),
    "qwen2": dict(
        family="qwen25", gguf=True, gguf_positions=None,
        config=dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=3,
                    rope_theta=1000000.0, max_position_embeddings=256, tie_word_embeddings=True,
                    use_sliding_window=False, sliding_window=32, max_window_layers=3,
                    rms_norm_eps=1e-6),
    ),
    "qwen3": dict(
        family="qwen3", gguf=True, gguf_positions=None,
        config=dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=3,
                    head_dim=32, rope_theta=1000000.0, max_position_embeddings=256,
                    tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                    sliding_window=None, max_window_layers=3, rms_norm_eps=1e-6),
    ),
    "mistral": dict(
        family="mistral", gguf=True, gguf_positions=5,
        config=dict(architectures=["MistralForCausalLM"], model_type="mistral", num_hidden_layers=3,
                    head_dim=32, rope_theta=1000000.0, max_position_embeddings=256,
                    tie_word_embeddings=False, sliding_window=5, rms_norm_eps=1e-5),
    ),
    # Every quirk, including the ones llama.cpp does not read from a GGUF file (a query scale
    # other than head_dim^-0.5, a sliding pattern other than 5:1): no GGUF from this one.
    "gemma3": dict(
        family="gemma3", gguf=False,
        config=dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=4,
                    head_dim=32, query_pre_attn_scalar=24, sliding_window=4, sliding_window_pattern=2,
                    rope_theta=1000000.0, rope_local_base_freq=10000.0,
                    rope_scaling=dict(rope_type="linear", factor=8.0), final_logit_softcapping=30.0,
                    attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
                    max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-6),
    ),
    # Gemma 3 as llama.cpp assumes it (5 sliding layers to 1 global, local base 10 000, query
    # scale head_dim^-0.5, as every size but 27B has): the GGUF fixture.
    "gemma3_gguf": dict(
        family="gemma3", gguf=True, gguf_positions=None,
        config=dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=6,
                    head_dim=32, query_pre_attn_scalar=32, sliding_window=4, sliding_window_pattern=6,
                    rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                    final_logit_softcapping=None, attn_logit_softcapping=None,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=256,
                    tie_word_embeddings=True, rms_norm_eps=1e-6),
    ),
}


def build_tokenizer(specials):
    """A byte-level BPE (SmolLM's pre-tokenization: single digits, GPT-2 regex, no prefix
    space) with the family's special tokens at ids 0.."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    return tok


def write_tokenizer(out, family):
    fam = FAMILIES[family]
    fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(fam["specials"]), **fam["roles"])
    fast.save_pretrained(out)
    # As the published checkpoints keep it: the template inside tokenizer_config.json.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = fam["template"]
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return AutoTokenizer.from_pretrained(out)


def write_model(out, spec, vocab, bos, eos):
    cfg = dict(SHAPE, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, **spec["config"])
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    torch.manual_seed(1234)
    config = AutoConfig.from_pretrained(out)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norm scales around their family's neutral value, so a wrong convention shows.
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.2 + (0.0 if "gemma" in cfg["model_type"] else 1.0))
            elif name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p) * (0.1 if "gemma" in cfg["model_type"] else 0.5))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            # The weights are bf16 values; the reference math runs on them in f32.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if spec.get("rope_parameters_format"):
        model.save_pretrained(out, safe_serialization=True)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
               if not (cfg["tie_word_embeddings"] and k == "lm_head.weight")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for extra in ["generation_config.json"]:
        (out / extra).unlink(missing_ok=True)
    return model.eval()


def reference_logits(model):
    cases = []
    for prompt in PROMPTS:
        ids = list(prompt)
        rows = []
        with torch.no_grad():
            for step in range(DECODE_STEPS + 1):
                logits = model(torch.tensor([ids])).logits[0]
                if step == 0:
                    prompt_rows = [r.tolist() for r in logits]
                rows.append(logits[-1].tolist())
                if step < DECODE_STEPS:
                    ids.append(int(torch.argmax(logits[-1])))
        cases.append(dict(prompt=prompt, tokens=ids, logits=[rnd(r) for r in rows],
                          prompt_logits=[rnd(r) for r in prompt_rows]))
    return cases


def rnd(row):
    return [float(f"{x:.6g}") for x in row]


def chat_cases(tok):
    out = []
    for messages in CONVERSATIONS:
        if tok.chat_template is None:
            continue
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        out.append(dict(messages=messages, add_generation_prompt=True, text=text, ids=list(ids)))
    return out


def convert_gguf(out, converter, modules):
    sys.path.insert(0, str(modules))
    sys.path.insert(0, str(Path(converter).parent))
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
    argv = sys.argv
    sys.argv = [converter, str(out), "--outtype", "bf16", "--outfile", str(out / "model.gguf")]
    try:
        runpy.run_path(converter, run_name="__main__")
    finally:
        sys.argv = argv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--converter", help="llama.cpp's convert_hf_to_gguf.py (GGUF fixtures)")
    ap.add_argument("--converter-modules", help="the folder holding its `conversion` package")
    ap.add_argument("--only", nargs="*", help="model names to regenerate")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        out = OUT / name
        out.mkdir(parents=True, exist_ok=True)
        tok = write_tokenizer(out, spec["family"])
        roles = FAMILIES[spec["family"]]["roles"]
        bos = tok.convert_tokens_to_ids(roles["bos_token"]) if "bos_token" in roles else None
        eos = tok.convert_tokens_to_ids(roles["eos_token"])
        model = write_model(out, copy.deepcopy(spec), len(tok), bos, eos)
        expected = dict(
            architecture=spec["config"]["architectures"][0],
            decode_steps=DECODE_STEPS,
            gguf=bool(spec.get("gguf")) and args.converter is not None,
            gguf_positions=spec.get("gguf_positions"),
            cases=reference_logits(model),
            chat=chat_cases(tok),
        )
        if expected["gguf"]:
            convert_gguf(out, args.converter, args.converter_modules or Path(args.converter).parent)
        (out / "expected.json").write_text(json.dumps(expected) + "\n")
        print(f"{name}: vocab {len(tok)}, {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
