"""The agent surface: the Markdown memory files, the memory tools and the MCP server agents reach PVM through."""
