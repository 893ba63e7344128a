"""The storm's load model: seeded, deterministic schedules within the configured ranges."""

from __future__ import annotations

import pytest

from edge_llm.bench.storm.corpus import corpus_words
from edge_llm.bench.storm.load import (
    QUESTION,
    StormSettings,
    StormSettingsError,
    start_offset,
    user_profile,
    user_turn,
)


def schedule(settings: StormSettings, users: int = 20, turns: int = 10) -> list[object]:
    return [
        (
            user_profile(settings, u),
            start_offset(settings, u),
            [user_turn(settings, u, t) for t in range(turns)],
        )
        for u in range(users)
    ]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    settings = StormSettings(seed=7)
    assert schedule(settings) == schedule(StormSettings(seed=7))
    assert schedule(settings) != schedule(StormSettings(seed=8))


def test_a_turn_does_not_depend_on_how_many_turns_were_drawn_before() -> None:
    settings = StormSettings(seed=3)
    late = user_turn(settings, 5, 9)
    for index in range(9):
        user_turn(settings, 5, index)
    assert user_turn(settings, 5, 9) == late


def test_draws_stay_within_their_ranges() -> None:
    settings = StormSettings(
        seed=1, prompt_tokens=(200, 300), patience_s=(2.0, 4.0), think_s=(0.5, 1.5),
        abandon_after_tokens=(5, 9), abandon_share=0.5,
    )  # fmt: skip
    for profile, offset, turns in schedule(settings, users=50):  # type: ignore[misc]
        assert 2.0 <= profile.patience_s <= 4.0
        assert 0.0 <= offset <= 1.5
        for turn in turns:
            assert 200 <= turn.prompt_tokens <= 300
            assert 0.5 <= turn.think_s <= 1.5
            assert turn.abandon_after_tokens is None or 5 <= turn.abandon_after_tokens <= 9


def test_shares_of_slow_users_and_abandoned_turns_follow_the_settings() -> None:
    settings = StormSettings(seed=11, slow_share=0.25, abandon_share=0.15)
    slow = sum(user_profile(settings, u).slow for u in range(2000))
    abandoned = sum(user_turn(settings, 0, t).abandon_after_tokens is not None for t in range(2000))
    assert 0.21 < slow / 2000 < 0.29
    assert 0.12 < abandoned / 2000 < 0.18
    none = StormSettings(seed=11, slow_share=0.0, abandon_share=0.0)
    assert not any(user_profile(none, u).slow for u in range(200))
    assert all(user_turn(none, 0, t).abandon_after_tokens is None for t in range(200))


def test_prompt_is_a_window_of_real_text_of_about_the_drawn_length() -> None:
    settings = StormSettings(seed=2, prompt_tokens=(400, 400), words_per_token=0.75)
    turn = user_turn(settings, 3, 4)
    prompt = turn.prompt(settings, "tag-1")
    text = prompt.messages[0]["content"]
    assert text.startswith("[tag-1] ")
    assert text.endswith(QUESTION)
    body = text.removeprefix("[tag-1] ").removesuffix("\n\n" + QUESTION).split()
    assert len(body) == 300
    words = corpus_words()
    assert body[:5] == [words[(turn.window_start + i) % len(words)] for i in range(5)]
    # A regenerate sends exactly the same text; another turn another window.
    assert turn.prompt(settings, "tag-1") == prompt
    assert user_turn(settings, 3, 5).prompt(settings, "tag-1") != prompt
    assert prompt.max_tokens == settings.max_tokens


def test_a_session_per_user() -> None:
    settings = StormSettings()
    assert user_profile(settings, 1).session != user_profile(settings, 2).session


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"users": 0}, "users"),
        ({"prompt_tokens": (500, 100)}, "prompt_tokens"),
        ({"abandon_share": 1.5}, "abandon_share"),
        ({"patience_s": (-1.0, 2.0)}, "patience"),
        ({"slow_tokens_per_s": 0.0}, "slow_tokens_per_s"),
        ({"duration_s": 0.0}, "duration"),
    ],
)
def test_bad_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(StormSettingsError, match=message):
        StormSettings(**change).check()  # type: ignore[arg-type]
