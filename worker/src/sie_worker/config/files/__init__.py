"""Reading a config file: strict YAML/JSON into plain data (``yamldoc``), the JSON Schema and
its errors as problems (``schema``), one spelling per setting and profile inheritance
(``normalize``), and the whole read (``reader``: schema, read-time rules, normalised
config); how paths, types and values are shown in problems (``jsonpath``, ``json_types``,
``values``)."""
