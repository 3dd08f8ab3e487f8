// A warm Node function: each request is served by a spare that imported this module
// before the request arrived.
export default async function (event) {
  const text = typeof event === "object" && event !== null ? String(event.text ?? "") : "";
  return { shout: text.toUpperCase() + "!" };
}
