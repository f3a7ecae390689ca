// A small, safe Markdown renderer for model output.
//
// Every character of the input is HTML-escaped first (& < > " '), so the text can no longer
// hold a tag or leave an attribute. Only then is a small subset turned into markup that this
// module writes itself: paragraphs and line breaks, fenced code blocks, headings, bullet and
// numbered lists, inline code, bold, italic, and links whose target is http:// or https://.
// Nothing else can come out: no raw HTML, no other attribute, no other URL scheme. The page's
// Content-Security-Policy (no inline script) is a second fence behind this one.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Inline code and links first (their insides take no emphasis), on escaped text.
const INLINE = /(`+)([^`\n]+?)\1|\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g;

function emphasis(text) {
  return text
    .replace(/\*\*(?=\S)([^*\n]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([^_\n]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^\w*])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![\w*])/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>");
}

function inline(escaped) {
  let out = "";
  let last = 0;
  for (const m of escaped.matchAll(INLINE)) {
    out += emphasis(escaped.slice(last, m.index));
    if (m[1]) {
      out += `<code>${m[2]}</code>`;
    } else {
      out += `<a href="${m[4]}" rel="noopener noreferrer" target="_blank">${emphasis(m[3])}</a>`;
    }
    last = m.index + m[0].length;
  }
  return out + emphasis(escaped.slice(last));
}

const FENCE = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.+?)\s*#*\s*$/;
const ITEM = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/;

// Markdown `src` as HTML text made only of the subset above.
export function renderMarkdown(src) {
  const lines = escapeHtml(String(src).replace(/\r\n?/g, "\n")).split("\n");
  const out = [];
  let para = [];
  let list = null; // { tag: "ul" | "ol", items: [escaped text] }

  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    para = [];
  };
  const flushList = () => {
    if (list) {
      const items = list.items.map((item) => `<li>${inline(item)}</li>`).join("");
      out.push(`<${list.tag}>${items}</${list.tag}>`);
    }
    list = null;
  };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      flushPara();
      flushList();
      const code = [];
      // An unclosed fence (an answer still streaming) runs to the end of the text.
      for (i++; i < lines.length && lines[i].trim() !== fence[1]; i++) code.push(lines[i]);
      const lang = fence[2] ? ` class="lang-${fence[2].toLowerCase()}"` : "";
      out.push(`<pre><code${lang}>${code.join("\n")}</code></pre>`);
      continue;
    }
    if (!line.trim()) {
      flushPara();
      flushList();
      continue;
    }
    const heading = line.match(HEADING);
    if (heading) {
      flushPara();
      flushList();
      const level = Math.min(heading[1].length + 2, 6); // the page's own h1/h2 stay above
      out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      continue;
    }
    const item = line.match(ITEM);
    if (item) {
      flushPara();
      const tag = item[1] ? "ul" : "ol";
      if (!list || list.tag !== tag) {
        flushList();
        list = { tag, items: [] };
      }
      list.items.push(item[3]);
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {
      list.items[list.items.length - 1] += ` ${line.trim()}`; // an item's next line
      continue;
    }
    flushList();
    para.push(line);
  }
  flushPara();
  flushList();
  return out.join("");
}
