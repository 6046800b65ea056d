"""The pieces of `bench/run.py`: pure arithmetic (stats, goals) apart from what runs processes
(stacks, floor, memory), so the arithmetic is unit-tested without starting anything."""
