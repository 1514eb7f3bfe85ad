from canopy_ray.core.lexical import bm25, named, scaled_bm25, terms, titled


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


def test_named_items_are_those_the_two_best_name_as_whole_words():
    titles = ["Chris Summers (ice hockey)", "Pittsburgh Penguins", "Penguin", "Lagos", "Iran", "NHL"]
    bodies = ["Summers plays for the Pittsburgh Penguins of the NHL.", "A team from Pittsburgh.",
              "Penguins are birds.", "A city of Nigeria.", "Iranian cuisine.", "The league of Chris Summers."]
    best = [0.9, 0.2, 0.1, 0.8, None, 0.3]
    # the two best ranked items are 0 and 3: 0 names the Penguins (not "Penguin": whole words); the
    # NHL is too short a name; "Chris Summers" is named by item 5 only, which is not among the best
    assert named(titles, bodies.__getitem__, best) == [False, True, False, False, False, False]
    assert named(titles, bodies.__getitem__, [0.1, 0.2, 0.1, 0.1, None, 0.9]) == [True, False, False, False, False, False]
    assert named(titles, bodies.__getitem__, best, items=1) == [False, True, False, False, False, False]
    assert named(["Lagos"], ["Lagos is a city."].__getitem__, [0.5]) == [False]  # never by itself
    assert named(titles, bodies.__getitem__, [None] * 6) == [False] * 6
    # item 5 (third, not among the two best) read too, as an item the question names: it names Chris Summers
    assert named(titles, bodies.__getitem__, best, also=[5]) == [True, True, False, False, False, False]


def test_titled_items_are_those_the_query_names_as_whole_words():
    # made-up names (no question of the shared sets names them)
    titles = ["Harrowgate (film)", "Mirela Vantosk", "KVT", "Harrowgate Vale", "Harrow", None]
    # the qualifier aside; whole words only ("Harrow" is in "Harrowgate" but not as a word); a
    # name under 4 characters never counts (KVT); a longer title the query does not hold in
    # full never does ("Harrowgate Vale"); an item without a title never does
    assert titled(titles, "Which other role did the lead actor of HARROWGATE play, and on KVT?") == \
        [True, False, False, False, False, False]
    assert titled(titles, "Who is Mirela Vantosk?") == [False, True, False, False, False, False]
    assert titled(titles, "") == [False] * 6
