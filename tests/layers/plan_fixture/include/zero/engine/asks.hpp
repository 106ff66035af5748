// check_plan_queries.py's fixture: an engine part that asks which plan it holds, three ways.
void a() {
  if (optimizer_.nvme() != nullptr) {
  }
  auto* h = plan_.host_part();
  if (std::get_if<on_host>(&plan_)) {
  }
}
