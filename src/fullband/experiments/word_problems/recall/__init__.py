"""``fullband eval-recall``: a task that needs attention and recurrence at once (lookup-then-compose word problems,
fullband.tasks.lookup_problems), the full-bandwidth model against transformers, LSTMs and an attention-then-LSTM
hybrid, trained exactly and with the paper's few-pass schedule (DESIGN.md §7 "Beyond recurrence")."""
