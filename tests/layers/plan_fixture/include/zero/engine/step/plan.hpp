// check_plan_queries.py's fixture: the plans themselves may name their optimizer (not reported).
void b() { auto* n = plan_.nvme(); }
