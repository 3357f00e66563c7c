"""Request text from token deltas: characters split across tokens, and the end of a request."""
from __future__ import annotations

from edge_infer.engine.request_fold import RequestText
from edge_infer.engine.protocol import TokenDelta
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.models.tokenizer import Tokenizer


def test_a_character_cut_by_the_last_token_ends_the_text_like_a_full_decode(demo_model):
    tokenizer = Tokenizer(demo_model)
    ids = tokenizer.encode("tea \u2615 and cake \u2615", add_special_tokens=False)
    assert tokenizer.decode(ids[-1:]) == "\ufffd"  # the last character takes several byte tokens
    cut = ids[:-1]  # the generation ended inside the last character
    text = RequestText(tokenizer, SamplingParams(max_tokens=len(cut)))
    pieces = [text.apply(TokenDelta("r", token_id=i)).text for i in cut[:-1]]
    assert "".join(pieces) == "tea \u2615 and cake "  # an incomplete character is not streamed
    pieces.append(text.apply(TokenDelta("r", token_id=cut[-1], finished=True, finish_reason="length")).text)
    assert "".join(pieces) == tokenizer.decode(cut) == "tea \u2615 and cake \ufffd"
