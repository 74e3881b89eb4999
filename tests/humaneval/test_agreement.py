"""Human-evaluation statistics against hand-computed numbers (Krippendorff 2011's worked examples and toys
counted by hand), not the libraries echoing themselves."""

from __future__ import annotations

import math

import pytest

from personalize.humaneval.agreement import (krippendorff_alpha, majority, position_bias, rank_correlation, rater_agreement,
                                   rubric_means)


def units_of(**coders: str) -> dict[int, dict[str, str]]:
    """{unit: {coder: value}} from one string per coder, "." for a missing value."""
    n = len(next(iter(coders.values())))
    return {u: {c: s[u] for c, s in coders.items() if s[u] != "."} for u in range(n)}


def test_alpha_binary_two_coders_krippendorff_2011_example_a():
    """A = 0100000010, B = 1110010000 (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability", A).
    Coincidences: units 4,5,7,8,10 agree on 0 -> o00 = 10; unit 2 agrees on 1 -> o11 = 2; units 1,3,6,9
    disagree -> o01 = o10 = 4. n0 = 14, n1 = 6, n = 20.
    alpha = 1 - (n-1) * o01 / (n0 * n1) = 1 - 19*4 / 84 = 8/84 = 0.0952."""
    units = units_of(A="0100000010", B="1110010000")
    assert krippendorff_alpha(units) == pytest.approx(8 / 84)
    assert round(krippendorff_alpha(units), 3) == 0.095


def test_alpha_nominal_string_labels_krippendorff_2011_example_b():
    """Ben = a a b b d c c c e d d a, Gerry = b a b b b c c c e d d d (Krippendorff 2011, example B).
    Disagreeing units 1 (a,b), 5 (d,b), 12 (a,d): off-diagonal sum of the coincidence matrix = 2*3 = 6.
    Value totals over both coders: a 4, b 6, c 6, d 6, e 2; n = 24.
    Expected off-diagonal: n^2 - sum n_c^2 = 576 - (16+36+36+36+4) = 448.
    alpha = 1 - (n-1) * 6 / 448 = 1 - 138/448 = 310/448 = 0.692."""
    units = units_of(Ben="aabbdcccedda", Gerry="babbbccceddd")
    assert krippendorff_alpha(units) == pytest.approx(310 / 448)
    assert round(krippendorff_alpha(units), 3) == 0.692


def test_alpha_four_coders_with_missing_values_krippendorff_2011_example_c():
    """Published value 0.743 for nominal data, 4 observers, 12 units, missing ratings (example C)."""
    units = units_of(A="123321412...", B="1233224125.3", C=".3332342251.", D="12332441251.")
    assert round(krippendorff_alpha(units), 3) == 0.743


def test_alpha_perfect_missing_and_undefined():
    assert krippendorff_alpha(units_of(x="abcab", y="abcab", z="ab.a.")) == pytest.approx(1.0)
    # a missing rating (None) is skipped, not a value: same as leaving the rater out of that unit
    with_none = {0: {"x": "a", "y": "a", "z": None}, 1: {"x": "b", "y": "b"}}
    assert krippendorff_alpha(with_none) == pytest.approx(1.0)
    assert krippendorff_alpha(units_of(x="aaaa", y="aaaa")) is None  # no variation at all
    assert krippendorff_alpha(units_of(x="ab..", y="..ab")) is None  # no unit rated twice
    assert krippendorff_alpha(units_of(x="aab", y="aa.")) is None  # pairable values never vary: 0/0
    assert krippendorff_alpha({}) is None
    with pytest.raises(ValueError):
        krippendorff_alpha(units_of(x="ab", y="ab"), level="cardinal")


def test_alpha_interval_level_uses_numbers():
    """Interval, 2 coders, units (1,2), (3,3), (5,4); delta^2 = (c-k)^2. Coincidences o12 = o21 = 1, o33 = 2,
    o45 = o54 = 1, so sum o*delta^2 = 4. Values 1,2,3,3,5,4: n = 6, squared deviations from the mean 3 sum to 10,
    and sum over ordered pairs of values of (v-v')^2 = 2*n*10 = 120.
    alpha = 1 - (n-1) * 4 / 120 = 1 - 20/120 = 5/6."""
    units = {0: {"p": 1, "q": 2}, 1: {"p": 3, "q": 3}, 2: {"p": 5, "q": 4}}
    assert krippendorff_alpha(units, level="interval") == pytest.approx(5 / 6)


def test_rater_agreement_counts_pairs_by_hand():
    """Unit 0: x=a y=a z=b -> x: 1 of 2, y: 1 of 2, z: 0 of 2.
    Unit 1: x=b y=b (z missing) -> x: 1 of 1, y: 1 of 1.
    Unit 2: z=c alone -> no comparison, does not count towards n.
    x: 2/3 over 2 units, y: 2/3 over 2 units, z: 0/2 over 1 unit; w rated only alone -> None."""
    units = {0: {"x": "a", "y": "a", "z": "b"}, 1: {"x": "b", "y": "b"}, 2: {"z": "c"}, 3: {"w": "a"}}
    got = rater_agreement(units)
    assert got["x"] == {"n": 2, "agreement": pytest.approx(2 / 3)}
    assert got["y"] == {"n": 2, "agreement": pytest.approx(2 / 3)}
    assert got["z"] == {"n": 1, "agreement": 0.0}
    assert got["w"] == {"n": 0, "agreement": None}


def test_position_bias_share_and_wilson_interval():
    got = position_bias(["a"] * 7 + ["b"] * 3 + ["tie", "both_bad"])
    assert got["a_share"] == pytest.approx(0.7) and got["n"] == 10
    assert 0 <= got["lower"] < 0.7 < got["upper"] <= 1
    # Wilson by hand: z = 1.95996, centre (7 + z^2/2) / (10 + z^2), half width z*sqrt(7*3/10 + z^2/4) / (10 + z^2)
    z = 1.959963984540054
    centre, half = (7 + z * z / 2) / (10 + z * z), z * math.sqrt(2.1 + z * z / 4) / (10 + z * z)
    assert got["lower"] == pytest.approx(centre - half) and got["upper"] == pytest.approx(centre + half)
    assert position_bias(["tie", "both_bad"]) == {"a_share": None, "n": 0, "lower": None, "upper": None}


def test_rank_correlation_by_hand_and_undefined():
    """x = 1,2,3,4 vs y = 1,3,2,4: rank differences 0,1,1,0, sum d^2 = 2, rho = 1 - 6*2/(4*15) = 0.8;
    pairs: 5 concordant, 1 discordant (2 vs 3) -> tau = (5-1)/6 = 2/3. Key e is only in x and is ignored."""
    got = rank_correlation({"a": 1, "b": 2, "c": 3, "d": 4, "e": 9}, {"a": 1, "b": 3, "c": 2, "d": 4})
    assert got["n"] == 4
    assert got["spearman"] == pytest.approx(0.8) and got["kendall"] == pytest.approx(2 / 3)
    assert 0 < got["spearman_p"] <= 1 and 0 < got["kendall_p"] <= 1
    constant = rank_correlation({"a": 1, "b": 2, "c": 3}, {"a": 5, "b": 5, "c": 5})
    assert constant["n"] == 3 and constant["spearman"] is None and constant["kendall_p"] is None
    assert rank_correlation({"a": 1, "b": 2}, {"a": 2, "b": 1})["spearman"] is None  # n < 3


def test_rubric_means_known_means_intervals_and_order():
    """m1 fluency 4,5,3 -> 4, style 2,2,2 -> 2, mean 3; m2 fluency 5,5 -> 5, style 4,3 -> 3.5, mean 4.25."""
    rows = [{"method": "m1", "fluency": 4, "style": 2}, {"method": "m1", "fluency": 5, "style": 2},
            {"method": "m1", "fluency": 3, "style": 2}, {"method": "m2", "fluency": 5, "style": 4},
            {"method": "m2", "fluency": 5, "style": 3}]
    got = rubric_means(rows, ["fluency", "style"], n_boot=200, seed=1)
    assert [g["method"] for g in got] == ["m2", "m1"]
    m2, m1 = got
    assert (m1["n"], m1["fluency"], m1["style"], m1["mean"]) == (3, 4.0, 2.0, 3.0)
    assert (m2["n"], m2["fluency"], m2["style"], m2["mean"]) == (2, 5.0, 3.5, 4.25)
    assert 3 <= m1["fluency_lower"] <= 4 <= m1["fluency_upper"] <= 5
    assert m1["style_lower"] == m1["style_upper"] == 2.0  # no spread, no interval
    assert m2["fluency_lower"] == m2["fluency_upper"] == 5.0 and 3 <= m2["style_lower"] <= m2["style_upper"] <= 4
    assert rubric_means(rows, ["fluency", "style"], n_boot=200, seed=1) == got  # seeded
    assert rubric_means([], ["fluency"]) == []


def test_majority_and_ties():
    assert majority(["a", "b", "a"]) == "a"
    assert majority(["a", "b"]) is None
    assert majority(["a", "a", "b", "b", "c"]) is None
    assert majority([]) is None
    assert majority(["tie"]) == "tie"
