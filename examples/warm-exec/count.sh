# Counts the words of the event's "text": the event arrives as JSON on stdin.
python3 -c 'import json, sys; e = json.load(sys.stdin); print(len(e.get("text", "").split()), "words")'
