"""What tests share: harnesses, object builders and helper processes, imported as
``kits.<name>`` by tests in every folder (a test module never imports another test module)."""
