// Editing a call's arguments before allowing it, deciding every shown call at
// once, and making invisible characters visible. Text goes on the page with
// textContent only.

// Format and bidi controls (U+202E and friends), zero-width characters, other
// invisible format characters, and C0/C1 controls except newline and tab.
const HIDDEN = /[\p{Cf}\u2028\u2029\u0000-\u0008\u000b-\u001f\u007f-\u009f]/gu;

/** The text with every invisible or direction-changing character written as ⟨U+XXXX⟩. */
export function reveal(text) {
  return String(text ?? "").replace(HIDDEN, (ch) => {
    const hex = ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    return `⟨U+${hex}⟩`;
  });
}

export function prettyArguments(args) {
  let text;
  try {
    text = JSON.stringify(args ?? {}, null, 2);
  } catch (err) {
    text = String(args);
  }
  return reveal(text);
}

const TYPES = {
  string: (v) => typeof v === "string",
  integer: (v) => Number.isInteger(v),
  number: (v) => typeof v === "number" && Number.isFinite(v),
  boolean: (v) => typeof v === "boolean",
  array: (v) => Array.isArray(v),
  object: (v) => v !== null && typeof v === "object" && !Array.isArray(v),
  null: (v) => v === null,
};

function typeProblem(value, schema, where) {
  if (!schema || typeof schema !== "object" || schema.type === undefined) return null;
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  const known = types.filter((t) => TYPES[t]);
  if (!known.length || known.some((t) => TYPES[t](value))) return null;
  return `At ${where}: expected ${types.join(" or ")}.`;
}

/** A first look at the edit against the call's schema (types, required, extra keys); the
 * server checks the full JSON Schema and has the last word. */
export function schemaProblem(value, schema) {
  if (!schema || typeof schema !== "object") return null;
  const top = typeProblem(value, schema, "$");
  if (top) return top;
  if (!TYPES.object(value)) return "At $: the arguments must be a JSON object.";
  for (const name of Array.isArray(schema.required) ? schema.required : []) {
    if (!(name in value)) return `At $: '${name}' is a required property.`;
  }
  const props = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
  for (const [name, item] of Object.entries(value)) {
    if (name in props) {
      const problem = typeProblem(item, props[name], `$.${name}`);
      if (problem) return problem;
    } else if (schema.additionalProperties === false) {
      return `At $: '${name}' is not an allowed property.`;
    }
  }
  return null;
}

/** The edited arguments, or a sentence saying why they cannot be sent. */
export function readEdit(text, schema) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { error: `Not valid JSON: ${err.message}` };
  }
  if (!TYPES.object(value)) return { error: "The arguments must be a JSON object ({…})." };
  const problem = schemaProblem(value, schema);
  return problem ? { error: problem } : { value };
}
