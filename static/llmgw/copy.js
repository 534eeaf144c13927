// A "Copy" button beside a secret shown once (a new client key, a new token): the button's
// data-copy names the element whose text it copies; the line beside it says it was done.
(function () {
  "use strict";
  // Said on the button itself for two seconds (where the eye is), and in the line beside
  // it, emptied first so that a second click is announced again.
  function said(button, text) {
    const note = button.parentElement.querySelector("[data-role=copied]");
    if (note) {
      note.textContent = "";
      window.setTimeout(function () { note.textContent = text; }, 50);
    }
    const done = text === "Copied.";
    button.textContent = done ? "Copied ✓" : "Not copied";
    button.classList.toggle("copied", done);
    window.clearTimeout(button._copyReset);
    button._copyReset = window.setTimeout(function () {
      button.textContent = "Copy";
      button.classList.remove("copied");
    }, 2000);
  }
  function fallback(element) {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    return document.execCommand("copy");
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const element = document.getElementById(button.dataset.copy);
    if (!element) return;
    const text = element.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { said(button, "Copied."); },
        function () { said(button, fallback(element) ? "Copied." : "Select it and copy it by hand."); }
      );
    } else {
      said(button, fallback(element) ? "Copied." : "Select it and copy it by hand.");
    }
  });
})();
