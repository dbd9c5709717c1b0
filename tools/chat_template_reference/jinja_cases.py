"""Templates that exercise each Jinja construct Loom's interpreter supports.

make_reference.py renders each with transformers' own chat-template
environment and stores the output next to it, for //train/data/jinja:template_test.
Each case: (name, template, variables).
"""

CASES = [
    ("text", "plain text\n", {}),
    ("output", "{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ e }}", {"a": "x", "b": 3, "c": 1.5, "d": None, "e": True}),
    ("float_repr", "{{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ 2.0 }} {{ 1/3 }} {{ 10/4 }}", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};{% endfor %}", {}),
    ("loop_vars", "{% for m in ms %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}:{{ m }} {% endfor %}", {"ms": ["a", "b", "c"]}),
    ("loop_filter_else", "{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set n = 0 %}{% for x in [1, 2] %}{% set n = n + x %}{{ n }}{% endfor %}|{{ n }}", {}),
    ("namespace", "{% set ns = namespace(found=false, count=0) %}{% for m in ms %}{% if m == 'b' %}{% set ns.found = true %}{% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.found }} {{ ns.count }}", {"ms": ["a", "b"]}),
    ("whitespace_control", "a  {%- if true -%}  b  {%- endif -%}  c\n  {{- ' d ' -}}  \ne", {}),
    ("trim_lstrip_blocks", "<\n  {% if true %}\n    yes\n  {% endif %}\n  {# comment #}\n>\n", {}),
    ("plus_markers", "<\n  {%+ if true +%}\nx\n{% endif %}>", {}),
    ("trailing_newline", "line\n", {}),
    ("concat", "{{ 'a' + 'b' }}{{ 'c' ~ 1 ~ none }}{{ 'x' 'y' }}", {}),
    ("compare_logic", "{{ 1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 3 and 1 != 2 }} {{ not 1 == 1 or 'a' < 'b' }} {{ 0 or 'fallback' }} {{ 'x' and 'y' }}", {}),
    ("in_not_in", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ 'x' in ('x', 'y') }}", {"d": {"k": 1}}),
    ("subscripts_slices", "{{ ms[0]['role'] }} {{ ms[-1].content }} {{ ms[1:] | length }} {{ ms[:-1][0].role }} {{ 'hello'[1:3] }} {{ 'héllo'[::-1] }} {{ xs[::2] | tojson }}", {"ms": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "xs": [0, 1, 2, 3, 4]}),
    ("filters", "{{ '  hi  ' | trim }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ [1, 2, 3] | length }}|{{ 'héllo' | length }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ [1, 2] | join(', ') }}|{{ [3, 4] | first }}{{ [3, 4] | last }}|{{ 'a-b' | replace('-', '+') }}|{{ 5 | string }}|{{ '7' | trim | length }}|{{ 2.7 | int }}", {}),
    ("tojson", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ 'é\"\\n' | tojson }}\n{{ [] | tojson }}{{ {} | tojson }}{{ none | tojson }}{{ 1.5 | tojson }}", {"d": {"name": "f", "args": [1, True, None, "ü"], "nested": {"a": []}}}),
    ("default", "{{ undefined_name | default('dflt') }} {{ d.missing | default('m') }} {{ '' | default('e', true) }} {{ x | d('no') }}", {"d": {}, "x": "yes"}),
    ("tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ d is mapping }} {{ l is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ t is true }} {{ t is false }} {{ 'a' is in ['a'] }} {{ s is not none }}", {"x": 1, "n": None, "s": "s", "d": {}, "l": [], "t": True}),
    ("missing_member_falsy", "{% if m.tool_calls %}calls{% else %}none{% endif %} {% if not m.tool_calls %}not{% endif %} {{ m.tool_calls is defined }} {{ m.tool_calls == none }}", {"m": {"role": "assistant"}}),
    ("methods", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a'.lstrip() }}|{{ 'a '.rstrip() }}|{{ 'a,b,,c'.split(',') | tojson }}|{{ ' a  b '.split() | tojson }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ d.get('k') }}{{ d.get('z', 'dz') }}{{ d.get('z') }}|{{ d.keys() | list | tojson }}{{ d.values() | list | tojson }}|{{ 'a</think>b'.split('</think>')[-1] }}", {"d": {"k": "v"}}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -3 + 1 }} {{ '=' * 3 }} {{ ([1] + [2]) | tojson }}", {}),
    ("ternary", "{{ 'yes' if flag else 'no' }} {{ 'a' if not flag else 'b' }}", {"flag": True}),
    ("set_list_dict", "{% set l = [1, 'two', none] %}{% set d = {'a': 1, 'b': [true]} %}{{ l | tojson }} {{ d | tojson }} {{ d['b'][0] }}", {}),
    ("dot_index", "{{ xs.0 }}{{ xs.1 }}", {"xs": ["p", "q"]}),
    ("string_escapes", "{{ 'tab\\tnl\\nq\\'s\\\\' }}|{{ \"dq\\\"\" }}|{{ '\\u00e9\\x41' }}", {}),
    ("generation", "{% for m in ms %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<end>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}", {"ms": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
]

# A template in the shape of Qwen2.5's (tools, tool calls, tool responses),
# written from its structure for this test: loops over dicts of tool calls,
# loop-variable reassignment, tojson of nested arguments, look-behind and
# look-ahead through messages[loop.index0 +- 1].
QWEN25_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CASES.append(("qwen25_tools", QWEN25_TOOLS, {
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                               "required": ["city"]}}}],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich and Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 3.5}"},
        {"role": "tool", "content": "{\"temp\": 7}"},
        {"role": "assistant", "content": "Zürich 3.5 °C, Paris 7 °C."},
    ],
    "add_generation_prompt": True,
}))
