from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuneforge.errors import TemplateError
from tuneforge.tune.template import KernelTemplate


def test_missing_variable_names_template_and_variable() -> None:
    template = KernelTemplate("tpl_missing", "int x = {{ BLOCK }} + {{ WIDTH }};", signature="void f()")
    with pytest.raises(TemplateError) as info:
        template.render({"BLOCK": 4})
    assert "tpl_missing" in str(info.value) and "'WIDTH' is undefined" in str(info.value)


def test_syntax_error_names_template_and_line() -> None:
    template = KernelTemplate("tpl_syntax", "line one\n{% if %}\n", signature="void f()")
    with pytest.raises(TemplateError, match="tpl_syntax.*line 2"):
        template.render({})


def test_duplicate_template_name_rejected() -> None:
    KernelTemplate("tpl_dup", "a", signature="void f()")
    KernelTemplate("tpl_dup", "a", signature="void f()")  # the same definition again (module reload) is fine
    with pytest.raises(TemplateError, match="duplicate template name 'tpl_dup'"):
        KernelTemplate("tpl_dup", "b", signature="void f()")


def test_hooks_render_last_and_see_the_body() -> None:
    def count_lines(config: object, body: str) -> str:
        return str(body.count("\n"))

    template = KernelTemplate("tpl_hooks", "// lines: {{ hook('lines') }}\n{% for i in range(N) %}x;\n{% endfor %}",
                              signature="void f()", hooks={"lines": count_lines})
    assert template.render({"N": 3}).startswith("// lines: 4\n")
    bad = KernelTemplate("tpl_bad_hook", "{{ hook('nope') }}", signature="void f()")
    with pytest.raises(TemplateError, match="unknown hook 'nope'"):
        bad.render({})


def test_choices_dedupe_and_runtime_params_share_one_artifact(cache_dir: Path) -> None:
    from tuneforge.tune.choices import dedupe

    source = 'extern "C" void scale(double* x, long n, double f) { for (long i = 0; i < n; ++i) x[i] *= f; }'

    def launch(kernel, args, config):  # type: ignore[no-untyped-def]
        kernel(args[0], args[0].size, float(config["F"]))

    template = KernelTemplate("tpl_runtime", source + "{{ '' if UNUSED else '' }}",
                              signature="void scale(double* x, long n, double f)", launcher=launch,
                              runtime_params={"F"})
    choices = template.choices([{"F": 2, "UNUSED": 1}, {"F": 3, "UNUSED": 1}, {"F": 2, "UNUSED": 0},
                                {"F": 2, "UNUSED": 1}])
    assert len({c.source for c in choices}) == 1
    assert len(dedupe(choices)) == 3  # a repeated configuration is one choice (hash = template + config)
    x = np.ones(4)
    for choice in choices[:2]:  # different configurations, one compiled artifact
        choice.build().result()
        choice.run([x])
    assert x.tolist() == [6.0] * 4
    from tuneforge.store.default import default_store

    store = default_store()
    modules = [key for key in store.keys() if (entry := store.get(key)) and entry.meta.get("module")]
    assert len(modules) == 1  # beside it, the object of its bindings (compile/split_module.py)


def test_python_template(cache_dir: Path) -> None:
    template = KernelTemplate("tpl_python", "def kernel(x, out):\n    out[...] = x * {{ FACTOR }}\n",
                              signature="kernel", language="python")
    (choice,) = template.choices([{"FACTOR": 5}])
    out = np.zeros(2)
    choice.run([np.ones(2), out])
    assert out.tolist() == [5.0, 5.0]


def test_a_kept_render_is_read_back_in_a_fresh_process_without_jinja(cache_dir: Path) -> None:
    from tuneforge.store.default import default_store

    from .conftest import run_python

    text = "def {{ name }}():\n    return {{ value }}\n"
    template = KernelTemplate("kept_render", text, signature="{{ name }}", language="python")
    rendered = template.render_kept({"name": "f", "value": 7})
    assert rendered == template.render({"name": "f", "value": 7}) == "def f():\n    return 7\n"
    kept = [key for key in default_store().keys() if key.startswith("txt")]
    assert len(kept) == 1
    out = run_python(f"""
        import sys
        from tuneforge.tune.template import KernelTemplate
        template = KernelTemplate("kept_render", {text!r}, signature="{{{{ name }}}}", language="python")
        print(repr(template.render_kept({{"name": "f", "value": 7}})), "jinja2" in sys.modules)
    """).stdout
    assert out.strip() == f"{rendered!r} False"
    assert template.render_kept({"name": "f", "value": 8}).endswith("return 8\n")  # other values: a render of their own


def test_templates_with_hooks_are_rendered_each_time(cache_dir: Path) -> None:
    from tuneforge.store.default import default_store

    template = KernelTemplate("kept_hooks", "x = 1\n{{ hook('tail') }}\n", signature="f", language="python",
                              hooks={"tail": lambda config, body: f"y = {config['n']}"})
    assert template.render_kept({"n": 3}) == "x = 1\ny = 3\n"
    assert not [key for key in default_store().keys() if key.startswith("txt")]  # code, not text: never kept
