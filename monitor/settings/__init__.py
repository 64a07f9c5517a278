"""How a room declares its settings: typed parsers and one ``setting(...)`` field per setting."""
