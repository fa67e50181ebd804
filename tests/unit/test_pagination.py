import pytest

from deltabus import InvalidArgument
from deltabus.pagination import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, decode_token, encode_token, page_size, take_page


def test_page_size_defaults_caps_and_rejects():
    assert page_size(None) == page_size(0) == DEFAULT_PAGE_SIZE
    assert page_size(7) == 7 and page_size(10**6) == MAX_PAGE_SIZE
    for bad in (-1, 1.5, "10", True):
        with pytest.raises(InvalidArgument) as e:
            page_size(bad)
        assert e.value.field == "page_size"


def test_tokens_round_trip_and_are_opaque_strings():
    token = encode_token("topics", "projects/p", "projects/p/topics/b")
    assert isinstance(token, str) and "projects/p" not in token and "=" not in token
    assert decode_token(token, "topics", "projects/p") == "projects/p/topics/b"
    assert decode_token("", "topics", "projects/p") is None and decode_token(None, "topics", "projects/p") is None


@pytest.mark.parametrize("token", ["garbage", "!!!", "e30", encode_token("topics", "projects/p", "x")[:-3], 12])
def test_malformed_tokens_name_page_token(token):
    with pytest.raises(InvalidArgument) as e:
        decode_token(token, "topics", "projects/p")
    assert e.value.field == "page_token"


def test_a_token_is_only_valid_for_its_own_listing():
    token = encode_token("topics", "projects/p", "projects/p/topics/b")
    for kind, scope in (("subscriptions", "projects/p"), ("topics", "projects/q")):
        with pytest.raises(InvalidArgument, match="another listing") as e:
            decode_token(token, kind, scope)
        assert e.value.field == "page_token"


def test_take_page_continues_after_the_last_name_even_when_names_change():
    names = ["a", "b", "c", "d", "e"]
    assert take_page(names, None, 2) == (["a", "b"], "b")
    assert take_page(names, "b", 2) == (["c", "d"], "d")
    assert take_page(names, "d", 2) == (["e"], None)
    assert take_page(names, None, 5) == (names, None)
    # Between calls "c" was deleted and "bb" created: nothing is repeated, nothing alive skipped.
    assert take_page(["a", "b", "bb", "d", "e"], "b", 2) == (["bb", "d"], "d")
    assert take_page([], None, 3) == ([], None)
