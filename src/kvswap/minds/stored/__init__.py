"""The stored conversations of OpenAI's Responses API (`store`, `previous_response_id`,
`conversation`): an embedded SQLite database of responses, their token segments, items and
conversations, with retention by time and bytes. `store.StoredRecords` is the one object the
minds layer holds; `db`, `responses`, `conversations` and `retention` are its inside."""
