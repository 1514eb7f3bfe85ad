from canopy_ray.core.lexical import bm25, scaled_bm25, terms


def test_terms_drop_stop_words_and_case():
    assert terms("When was the Eiffel Tower built?") == ["eiffel", "tower", "built"]


def test_bm25_prefers_rare_words_and_shorter_texts():
    texts = ["Stumpf was named CEO of Wells Fargo in 2007.",
             "Stumpf was named CEO of Wells Fargo in 2007. He grew up in Minnesota on a farm with ten siblings.",
             "The Eiffel Tower is in Paris.", "Wells Fargo is a bank."]
    s = bm25("When was Stumpf named CEO of Wells Fargo?", texts)
    assert s[0] > s[1] > s[3] > s[2] == 0.0  # same matches, shorter text first; no match scores 0


def test_scaled_bm25_is_in_zero_one_and_all_zero_without_overlap():
    s = scaled_bm25("Stumpf CEO", ["Stumpf is CEO.", "Stumpf.", "Paris."])
    assert max(s) == 1.0 and s[2] == 0.0
    assert scaled_bm25("moon", ["sun", "star"]) == [0.0, 0.0]
    assert scaled_bm25("moon", []) == []
