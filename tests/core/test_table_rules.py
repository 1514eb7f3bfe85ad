from canopy_ray.core.table_rules import table_kind


def test_aggregates_over_rows_are_aggregation_and_single_cells_lookup():
    for q in ("How many segments had revenue above $1 million?", "What is the average revenue from 2017 to 2019?",
              "Which year had the highest net income?", "List all the subsidiaries in Europe."):
        assert table_kind(q) == "aggregation", q
    for q in ("What was the total revenue in 2019?", "What is the change in cost of sales from 2018 to 2019?",
              "What was the percentage change in Fixed sales?", "What were the Other sales in 2018?"):
        assert table_kind(q) == "lookup", q
