"""Paper tables, reproduction ledgers and figures from built results: frame (the long frame), load (results), stats
(CIs and tests), render (text, Markdown), build (a table), ledger (claims), figures, token_credit, html."""
