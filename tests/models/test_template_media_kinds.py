"""Which media kinds a checkpoint's chat template renders (what its plan sizes and its frontend accepts)."""
import json

import pytest

from edge_infer.models.tokenizer import template_media_kinds

KINDS = ("image", "video", "audio")
RENDER = ("{% for m in messages %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}"
          "{% elif p.type in ACCEPTED %}<{{ p.type }}>{% else %}{{ raise_exception('no ' + p.type) }}{% endif %}"
          "{% endfor %}{% endfor %}")


def checkpoint(tmp_path, template: str | None):
    config = {} if template is None else {"chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("accepted", [("image",), ("image", "video"), KINDS, ()])
def test_the_kinds_a_template_renders(tmp_path, accepted):
    template = RENDER.replace("ACCEPTED", repr(list(accepted)))
    assert template_media_kinds(checkpoint(tmp_path, template), KINDS) == accepted


@pytest.mark.parametrize("template", [None, "{% if %}", "{{ raise_exception('this template wants a system turn') }}"],
                         ids=["no template", "does not parse", "refuses a text-only turn"])
def test_a_template_that_fails_for_reasons_not_media_keeps_every_kind(tmp_path, template):
    # its chat requests fail with that reason; refusing media here would only hide it behind another message
    assert template_media_kinds(checkpoint(tmp_path, template), KINDS) == KINDS
