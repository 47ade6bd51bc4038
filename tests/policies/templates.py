"""Chat templates shared by the policy tests: Qwen3's shape, written out (no model download)."""

QWEN3_STYLE = (  # Qwen3's shape: a think block only on the last assistant turn; an empty one when thinking is off
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for i in range(messages|length - 1, -1, -1) %}"
    "{%- if ns.last_user < 0 and messages[i].role == 'user' %}{%- set ns.last_user = i %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and loop.last and loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content | trim + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")

# The same template with what real model folders' templates also use: strftime_now and raise_exception.
QWEN3_WITH_CHECKS = QWEN3_STYLE.replace(
    "{%- for m in messages %}",
    "{%- if strftime_now('%Y') | length != 4 %}{{ raise_exception('no date') }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}"
    "{%- endif %}", 1)
