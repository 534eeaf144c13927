// A "Copy" button beside a secret shown once (a new client key, a new token): the button's
// data-copy names the element whose text it copies; the line beside it says it was done.
(function () {
  "use strict";
  function said(button, text) {
    const note = button.parentElement.querySelector("[data-role=copied]");
    if (note) note.textContent = text;
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
